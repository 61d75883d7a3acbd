// Inline PTX wrappers for the BF16 tensor-core stages (05, 06, 07). Chapter 05 explains each one.
// Every shared-memory operand is a 32-bit shared-window address (see smem_address).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include <cuda_bf16.h>

// The 32-bit address of a shared-memory pointer, as ldmatrix and cp.async take it.
__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// ---- mma.sync --------------------------------------------------------------------------
// D = A B + D for one warp: A is 16x16 bf16 (4 registers of bf16x2, row-major fragment),
// B is 16x8 bf16 (2 registers, "col": each register holds two consecutive k of one column),
// C/D are 16x8 FP32 (4 registers). Lane l holds rows l/4 and l/4 + 8, columns 2(l%4), +1.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- ldmatrix --------------------------------------------------------------------------
// Loads 8x8 bf16 matrices from shared memory into the fragment layout of mma: lanes 8i..8i+7
// give the addresses of the 8 rows (16 bytes each) of matrix i; register i of lane l then
// holds row l/4, columns 2(l%4) and 2(l%4)+1 of matrix i. .trans delivers the transpose.
__device__ __forceinline__ void ldmatrix_x2(uint32_t& r0, uint32_t& r1, uint32_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r0), "=r"(r1) : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t& r0, uint32_t& r1, uint32_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r0), "=r"(r1) : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
}

// ---- cp.async --------------------------------------------------------------------------
// 16 bytes global -> shared without passing through registers; .cg caches in L2 only.
__device__ __forceinline__ void cp_async_16(uint32_t shared, const void* global) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared), "l"(global));
}
// The same, but copies only when `valid`: with a source size of 0 the 16 shared bytes are
// zero-filled and global memory is not read (the address must still be a legal one).
__device__ __forceinline__ void cp_async_16_zfill(uint32_t shared, const void* global,
                                                  bool valid) {
    const int source_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(global),
                 "r"(source_bytes));
}
// Closes the group of cp.async issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most N committed groups are still in flight (the N most recent).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---- bulk asynchronous copies (Hopper, sm_90) -------------------------------------------------
// The copy engine adds `bytes` (a multiple of 16, both addresses 16-byte aligned) of FP32 from
// shared memory into global memory, element by element, while the warps go on. The shared
// memory must have been written before: each writing thread runs fence_proxy_async_shared()
// (ordinary stores and the copy engine are different "proxies"), then a barrier, then one
// thread issues the copy and commits it as a bulk group.
// Declared in the host pass too (the kernels that call them are parsed there); absent from the
// device code of GPUs before Hopper, which have no such instructions.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
__device__ __forceinline__ void bulk_reduce_add_f32(float* global, uint32_t shared, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 ::"l"(global), "r"(shared), "r"(bytes) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's bulk groups are still reading their shared memory
// (which may then be rewritten) ...
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// ... or are still in flight at all.
template <int N>
__device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif

// ---- register packing --------------------------------------------------------------------
// Two floats rounded to bf16 in one 32-bit register, `low` in the low half: the order in which
// mma reads two neighbouring columns of an A fragment.
__device__ __forceinline__ uint32_t pack_bf16x2(float low, float high) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<const uint32_t*>(&pair);
}

// ---- fast math ---------------------------------------------------------------------------
// 2^x in one MUFU.EX2 instruction (ex2.approx, flush-to-zero): exp2f without -use_fast_math
// adds a range fix-up for denormal results that the softmax does not need. 2^-inf = +0.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// 2^x without the exponent unit, computed on the FMA pipe (and one integer add), for the
// softmax's x = s * scale_log2 - max_offset <= 0. The exponent unit does 16 exponentials per
// clock and SM, the FMA pipe 128 FMAs, so where the exponentials bound a loop some of them can
// move here (stage 10 at D = 64; lab notes 10 have the numbers).
//   Range reduction: x = j + f with j = round(x), f in [-1/2, 1/2], both exact: adding
//   1.5 * 2^23 leaves j in the low mantissa bits of t (floats there are 1 apart), and
//   (t - 1.5 * 2^23) is j as a float. Then 2^x = 2^j * 2^f: 2^f by a polynomial that is exactly
//   1 at f = 0, and j added to the exponent bits of the result ((bits(t) << 23) is j << 23
//   modulo 2^32). Rounding to the nearest j keeps the row's maximum exact: its x is 0 up to a
//   rounding error of either sign, which rounding down would send to f = 1 - tiny.
//   The clamp at -127 makes -inf (masked scores) and NaN give +0, as does every x <= -127;
//   between -127 and -126 the result is below 2^-126 (a subnormal), where ex2.approx.ftz gives
//   0. Valid for x <= 126.
//   The coefficients minimise the largest relative error of 1 + f (c1 + c2 f + ...) against 2^f
//   on [-1/2, 1/2] (Remez: bench/experiments/exp2_fma_accuracy.cu, which also measures every
//   float x in [-127, 0] and the test suite's checks): at degree 3 it is 1.0e-4, 39 times below
//   bf16's rounding of P (2^-8).
// On the host the same arithmetic (rint for the rounded add): bit for bit the device's.
template <int DEGREE = 3>
__host__ __device__ __forceinline__ float poly_exp2(float x) {
    static_assert(DEGREE >= 2 && DEGREE <= 4, "poly_exp2: degree 2, 3 or 4");
    constexpr float SHIFTER = 12582912.0f;  // 1.5 * 2^23
    x = fmaxf(x, -127.0f);
#ifdef __CUDA_ARCH__
    const float t = __fadd_rn(x, SHIFTER);
#else
    const float t = SHIFTER + rintf(x);  // exact, as the device's rounded add is for |x| <= 2^22
#endif
    const float f = x - (t - SHIFTER);  // in [-1/2, 1/2], exact
    float p;
    if constexpr (DEGREE == 2) {
        p = fmaf(fmaf(0x1.eb3dd4p-3f, f, 0x1.67e7fcp-1f), f, 1.0f);
    } else if constexpr (DEGREE == 3) {
        p = fmaf(fmaf(fmaf(0x1.c2a218p-5f, f, 0x1.f00c4cp-3f), f, 0x1.62f5fap-1f), f, 1.0f);
    } else {
        p = fmaf(fmaf(fmaf(fmaf(0x1.3a02ccp-7f, f, 0x1.c9fc46p-5f), f, 0x1.ec0378p-3f), f,
                      0x1.62e12cp-1f), f, 1.0f);
    }
#ifdef __CUDA_ARCH__
    return __int_as_float((__float_as_int(t) << 23) + __float_as_int(p));
#else
    uint32_t t_bits, p_bits;
    memcpy(&t_bits, &t, 4);
    memcpy(&p_bits, &p, 4);
    const uint32_t bits = (t_bits << 23) + p_bits;
    float result;
    memcpy(&result, &bits, 4);
    return result;
#endif
}

// ---- code generation -----------------------------------------------------------------------
// Makes `value` look modified at this point, at no cost. Called on the per-lane base addresses
// at the top of a loop, it stops the compiler from hoisting every distinct (base + constant)
// ldmatrix address out of the loop into its own register (64 and more of them, which spill);
// each address is then formed at its use, where it becomes the immediate offset of LDSM.
__device__ __forceinline__ void refresh_register(uint32_t& value) {
    asm volatile("" : "+r"(value));
}
