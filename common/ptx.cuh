// Inline PTX wrappers for the BF16 tensor-core stages (05, 06, 07). Chapter 05 explains each one.
// Every shared-memory operand is a 32-bit shared-window address (see smem_address).
#pragma once

#include <cstdint>

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
// stmatrix (Hopper, sm_90) is the way back: register i of every lane, in the same fragment layout,
// to matrix i, whose 8 rows go to the addresses that lanes 8i..8i+7 give.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
__device__ __forceinline__ void stmatrix_x4(uint32_t address, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(r[0]),
                 "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}
#endif

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
// The same for 32-bit integers (stage 11's deterministic dQ in fixed point): wrapping adds, so
// the sum does not depend on the order in which the pieces arrive.
__device__ __forceinline__ void bulk_reduce_add_s32(int32_t* global, uint32_t shared, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.s32 [%0], [%1], %2;\n"
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

// ---- code generation -----------------------------------------------------------------------
// Makes `value` look modified at this point, at no cost. Called on the per-lane base addresses
// at the top of a loop, it stops the compiler from hoisting every distinct (base + constant)
// ldmatrix address out of the loop into its own register (64 and more of them, which spill);
// each address is then formed at its use, where it becomes the immediate offset of LDSM.
__device__ __forceinline__ void refresh_register(uint32_t& value) {
    asm volatile("" : "+r"(value));
}
