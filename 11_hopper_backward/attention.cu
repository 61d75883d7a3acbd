// Stage 11: the backward pass on Hopper. One block owns a tile of BLOCK_KV keys and walks the
// query tiles that can see them. A producer warpgroup streams Q, dO, LSE and D through an
// mbarrier ring by TMA; each of two consumer warpgroups owns 64 of the block's keys and, per
// query tile, computes S^T = K Q^T and dP^T = V dO^T with wgmma from shared memory, P^T and
// dS^T in registers, then dV += P^T dO and dK += dS^T Q with P^T and dS^T as the register
// operand, and its share of dQ = dS K from a copy of dS^T in shared memory. The consumers take
// turns at issuing their wgmma, as stage 10's do, so that one's elementwise work runs under the
// other's GEMMs. dQ is summed in FP32 in device memory by the copy engine
// (cp.reduce.async.bulk), so no consumer ever waits for another block; a last kernel scales it
// and rounds it to bf16. With AttentionShape::deterministic the pieces are added as 32-bit
// integers instead, each row scaled by a bound on its sums (dq_fixed_point.h): integer sums do
// not depend on the order of their terms, so the bits do not either. The forward that produces O and
// LSE is stage 10's, verbatim (bench/check_forward_copy.py checks that it stays so).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include "attention.h"
#include "dq_fixed_point.h"
#include "cuda_check.h"
#include "hopper.cuh"
#include "ptx.cuh"
#include "timeline.cuh"
#include "validate.h"
#include "workspace.h"

namespace {

// ---- forward: begin (stage 10's, verbatim) ------------------------------------------------
using bf16 = __nv_bfloat16;

// One kernel configuration. Warpgroup 0 is the producer; each consumer warpgroup owns 64 query
// rows (wgmma's M). A tile of HEAD_DIM columns is stored as HEAD_DIM / 64 slabs of [rows][64]: a
// 128-byte swizzled row holds 64 bf16, so wider heads take several slabs side by side.
template <int HEAD_DIM_, int CONSUMERS_, int BLOCK_KV_, int STAGES_>
struct Tiling {
    static constexpr int HEAD_DIM = HEAD_DIM_;
    static constexpr int CONSUMERS = CONSUMERS_;     // consumer warpgroups
    static constexpr int THREADS = 128 * (1 + CONSUMERS);
    static constexpr int BLOCK_Q = 64 * CONSUMERS;   // Br
    static constexpr int BLOCK_KV = BLOCK_KV_;       // Bc
    static constexpr int STAGES = STAGES_;           // K and V tiles in flight
    static constexpr int SLABS = HEAD_DIM / 64;
    // Registers per thread after setmaxnreg: the producer keeps few, the consumers take the
    // rest of the 64K register file (multiples of 8; 128 x 24 + 256 x 240 = 64,512 with two
    // consumers, 128 x 32 + 384 x 160 = 65,536 with three).
    static constexpr int PRODUCER_REGISTERS = CONSUMERS == 2 ? 24 : 32;
    static constexpr int CONSUMER_REGISTERS = CONSUMERS == 2 ? 240 : 160;
    static constexpr uint32_t Q_BYTES = BLOCK_Q * HEAD_DIM * sizeof(bf16);
    static constexpr uint32_t KV_BYTES = BLOCK_KV * HEAD_DIM * sizeof(bf16);
    // + 1024: the tiles start on a 1024-byte boundary (the swizzle atom), rounded up in-kernel.
    static constexpr size_t SHARED_BYTES = Q_BYTES + 2 * STAGES * size_t(KV_BYTES) + 1024;
};

// Tuned on the H100 (the lab notes have the alternatives): at D = 64 three consumers share each
// K/V tile, so a tile feeds 192 query rows; at D = 128 the non-causal kernel takes 176 keys per
// tile, and the causal one 128 (a wider tile wastes more of its work on the diagonal).
using Tiling64 = Tiling<64, 3, 128, 2>;
using Tiling128 = Tiling<128, 2, 176, 2>;
using Tiling128Causal = Tiling<128, 2, 128, 2>;
template <class Config>
constexpr bool fits_register_file =
    Config::PRODUCER_REGISTERS * 128 + Config::CONSUMER_REGISTERS * 128 * Config::CONSUMERS <= 65536;
static_assert(fits_register_file<Tiling64> && fits_register_file<Tiling128> &&
              fits_register_file<Tiling128Causal>);

constexpr int MAX_LENGTH = 1 << 30;  // keeps every tile index and TMA coordinate inside int
constexpr float LOG2E = 1.4426950408889634f;
constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr uint32_t SLAB_ROW_BYTES = 64 * sizeof(bf16);  // one swizzled row: 128 bytes

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// One block: BLOCK_Q query rows of one (batch, head), the grid ordered as in stage 06 (heads in
// L2-sized groups, the longest causal tiles first). __launch_bounds__ caps the registers from
// the block's thread count (384 threads: 168 each), the budget setmaxnreg moves between the
// warpgroups; its second argument, 1, changes nothing here (the cap and the SASS are the same
// without it).
template <class Config>
__global__ void __launch_bounds__(Config::THREADS, 1)
flash_forward_pingpong_kernel(const __grid_constant__ CUtensorMap q_map,
                                 const __grid_constant__ CUtensorMap k_map,
                                 const __grid_constant__ CUtensorMap v_map,
                                 const __grid_constant__ CUtensorMap o_map, float* __restrict__ lse,
                                 int batch_heads, int group_heads, int len_q, int len_kv,
                                 int q_tiles, float scale, bool causal) {
    constexpr int HEAD_DIM = Config::HEAD_DIM, BLOCK_Q = Config::BLOCK_Q;
    constexpr int BLOCK_KV = Config::BLOCK_KV, STAGES = Config::STAGES, SLABS = Config::SLABS;
    constexpr int QK_STEPS = HEAD_DIM / 16;  // k-steps of S = Q K^T (over the head dim)
    constexpr int PV_STEPS = BLOCK_KV / 16;  // k-steps of O = P V (over the keys)

    constexpr int CONSUMER_WARPS = 4 * Config::CONSUMERS;
    __shared__ uint64_t q_full;            // Q has landed
    __shared__ uint64_t k_full[STAGES];    // the stage's K tile has landed
    __shared__ uint64_t v_full[STAGES];    // the stage's V tile has landed
    __shared__ uint64_t k_empty[STAGES];   // every consumer warp is done with the stage's K
    __shared__ uint64_t v_empty[STAGES];   // every consumer warp is done with the stage's V
    extern __shared__ unsigned char dynamic_shared[];
    bf16* q_tile = reinterpret_cast<bf16*>(
        (reinterpret_cast<uintptr_t>(dynamic_shared) + 1023) & ~uintptr_t(1023));
    bf16* k_tiles = q_tile + BLOCK_Q * HEAD_DIM;             // [STAGES][SLABS][BLOCK_KV][64]
    bf16* v_tiles = k_tiles + STAGES * BLOCK_KV * HEAD_DIM;  // [STAGES][SLABS][BLOCK_KV][64]

    const int group_blocks = group_heads * q_tiles;
    const int group = int(blockIdx.x) / group_blocks;
    const int first_head = group * group_heads;
    const int heads_in_group = min(group_heads, batch_heads - first_head);
    const int rank = int(blockIdx.x) - group * group_blocks;
    const int q_block = q_tiles - 1 - rank / heads_in_group;
    const int head = first_head + rank % heads_in_group;
    const int q_start = q_block * BLOCK_Q;
    const int warpgroup = int(threadIdx.x) / 128 - 1;  // -1: the producer; 0, 1: consumers
    const int warp = int(threadIdx.x) % 128 / 32;       // inside the warpgroup
    const int lane = int(threadIdx.x) % 32;
    // wgmma accumulators: this thread holds rows fragment_row and fragment_row + 8 of its warp's
    // 16, columns 8i + fragment_column and one more.
    const int fragment_row = lane / 4;
    const int fragment_column = 2 * (lane % 4);
    const int warpgroup_row = warpgroup * 64;  // first row of this warpgroup inside the tile
    TIMELINE_BEGIN;  // the phase stamps (common/timeline.cuh): nothing unless measured

    int kv_tiles = ceil_div(len_kv, BLOCK_KV);
    if (causal) kv_tiles = min(kv_tiles, ceil_div(q_start + BLOCK_Q, BLOCK_KV));

    if (threadIdx.x == 0) {
        mbarrier_init(&q_full, 1);
        for (int stage = 0; stage < STAGES; ++stage) {
            mbarrier_init(&k_full[stage], 1);
            mbarrier_init(&v_full[stage], 1);
            mbarrier_init(&k_empty[stage], CONSUMER_WARPS);
            mbarrier_init(&v_empty[stage], CONSUMER_WARPS);
        }
        fence_barrier_init();
    }
    __syncthreads();

    if (warpgroup < 0) {
        // The producer: one thread walks the K/V tiles, waits until the stage it is about to
        // fill has been released by every consumer warp, and asks for the next tile. On the
        // first pass through the ring the stages are free: waiting on the parity of the phase
        // before the first one returns at once.
        setmaxnreg_dec<Config::PRODUCER_REGISTERS>();
        if (threadIdx.x == 0) {
            TIMELINE_STAMP(TIMELINE_START, 0);
            mbarrier_arrive_expect_tx(&q_full, Config::Q_BYTES);
            for (int slab = 0; slab < SLABS; ++slab)
                tma_load_3d(q_tile + slab * BLOCK_Q * 64, &q_map, slab * 64, q_start, head, &q_full);
            for (int kv_tile = 0; kv_tile < kv_tiles; ++kv_tile) {
                const int stage = kv_tile % STAGES;
                const uint32_t free_parity = (kv_tile / STAGES + 1) % 2;
                mbarrier_wait(&k_empty[stage], free_parity);
                mbarrier_arrive_expect_tx(&k_full[stage], Config::KV_BYTES);
                for (int slab = 0; slab < SLABS; ++slab)
                    tma_load_3d(k_tiles + (stage * SLABS + slab) * BLOCK_KV * 64, &k_map, slab * 64,
                                kv_tile * BLOCK_KV, head, &k_full[stage]);
                mbarrier_wait(&v_empty[stage], free_parity);
                mbarrier_arrive_expect_tx(&v_full[stage], Config::KV_BYTES);
                for (int slab = 0; slab < SLABS; ++slab)
                    tma_load_3d(v_tiles + (stage * SLABS + slab) * BLOCK_KV * 64, &v_map, slab * 64,
                                kv_tile * BLOCK_KV, head, &v_full[stage]);
                TIMELINE_STAMP(TIMELINE_LOADED, kv_tile);
            }
            TIMELINE_STAMP(TIMELINE_END, kv_tiles);
        }
        return;
    }
    setmaxnreg_inc<Config::CONSUMER_REGISTERS>();
    TIMELINE_STAMP(TIMELINE_START, 0);

    // Descriptors of the operands. Q and K are K-major (the head dim is contiguous): k-step
    // `step` is slab step / 4, 32 bytes further along each row per step inside it. V is read as
    // the MN-major B of O = P V: k-step `step` is keys 16 step .. 16 step + 15, 2048 bytes down;
    // the slabs of its head dim are BLOCK_KV rows apart.
    auto q_descriptor = [&](int step) {
        return make_smem_descriptor(q_tile + (step / 4) * BLOCK_Q * 64 + warpgroup_row * 64 +
                                        (step % 4) * 16, 16, 8 * SLAB_ROW_BYTES);
    };
    auto k_descriptor = [&](int stage, int step) {
        return make_smem_descriptor(k_tiles + (stage * SLABS + step / 4) * BLOCK_KV * 64 + (step % 4) * 16,
                                    16, 8 * SLAB_ROW_BYTES);
    };
    auto v_descriptor = [&](int stage, int step) {
        return make_smem_descriptor(v_tiles + stage * SLABS * BLOCK_KV * 64 + step * 16 * 64,
                                    BLOCK_KV * SLAB_ROW_BYTES, 8 * SLAB_ROW_BYTES);
    };

    // Does a tile hold scores to hide: past len_kv, or above the diagonal?
    auto needs_mask = [&](int kv_start) {
        return !(kv_start + BLOCK_KV <= len_kv && !(causal && kv_start + BLOCK_KV - 1 > q_start + warpgroup_row));
    };
    // Masks the scores a tile can hide. Its first line is needs_mask's test written out: a call
    // to needs_mask there changes the schedule of the D = 64 kernel (lab notes 10).
    auto mask = [&](float (&s)[BLOCK_KV / 2], int kv_start) {
        if (kv_start + BLOCK_KV <= len_kv && !(causal && kv_start + BLOCK_KV - 1 > q_start + warpgroup_row))
            return;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = q_start + warpgroup_row + warp * 16 + fragment_row + r * 8;
            const int visible = (causal ? min(len_kv, row + 1) : len_kv) - kv_start - fragment_column;
#pragma unroll
            for (int n = 0; n < BLOCK_KV / 8; ++n)
#pragma unroll
                for (int i = 0; i < 2; ++i)
                    if (n * 8 + i >= visible) s[4 * n + 2 * r + i] = -INFINITY;
        }
    };

    float o_accumulator[HEAD_DIM / 2] = {};
    // Rows fragment_row ([0]) and fragment_row + 8 ([1]): m is the running max of the raw
    // scores, l this thread's share of the running sum (its columns only), summed over the quad
    // of threads that share the row once at the end.
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.0f, 0.0f};
    const float scale_log2 = scale * LOG2E;  // exp(scale * x) = 2^(x * scale * log2 e)

    // Online softmax in FP32, in place: S becomes exp(scale * (S - m_new)); alpha is the factor
    // that moves O and l from the old running max to the new one.
    auto softmax = [&](float (&s)[BLOCK_KV / 2], float (&alpha)[2]) {
        float m_new[2] = {m[0], m[1]};
#pragma unroll
        for (int n = 0; n < BLOCK_KV / 8; ++n) {
            m_new[0] = fmaxf(m_new[0], fmaxf(s[4 * n + 0], s[4 * n + 1]));
            m_new[1] = fmaxf(m_new[1], fmaxf(s[4 * n + 2], s[4 * n + 3]));
        }
        float max_offset[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            m_new[r] = fmaxf(m_new[r], __shfl_xor_sync(FULL_MASK, m_new[r], 1));
            m_new[r] = fmaxf(m_new[r], __shfl_xor_sync(FULL_MASK, m_new[r], 2));
            // A row with no visible key yet keeps max -inf: use 0, so no inf - inf.
            max_offset[r] = m_new[r] == -INFINITY ? 0.0f : m_new[r] * scale_log2;
            alpha[r] = fast_exp2(m[r] * scale_log2 - max_offset[r]);
            m[r] = m_new[r];
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int n = 0; n < BLOCK_KV / 8; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                s[4 * n + i] = fast_exp2(fmaf(s[4 * n + i], scale_log2, -max_offset[i / 2]));
                l[i / 2] += s[4 * n + i];
            }
    };
    // The main loop's softmax, after the mask where the tile needs one. At D = 128 the softmax is
    // called in both arms of the branch: with one call after it, ptxas moves the loop's second
    // wgmma wait up before the softmax. D = 64 keeps the one call: it is bound by the exponent
    // unit, and this form measured faster there.
    auto masked_softmax = [&](float (&s)[BLOCK_KV / 2], float (&alpha)[2], int kv_start) {
        if constexpr (HEAD_DIM == 128) {
            if (needs_mask(kv_start)) {
                mask(s, kv_start);
                softmax(s, alpha);
            } else {
                softmax(s, alpha);
            }
        } else {
            mask(s, kv_start);
            softmax(s, alpha);
        }
    };
    // P as bf16 A fragments: the accumulators of 8-column tiles 2k and 2k+1 are exactly the A
    // fragment of k-step k.
    uint32_t p[PV_STEPS][4];
    auto pack_p = [&](const float (&s)[BLOCK_KV / 2]) {
#pragma unroll
        for (int n = 0; n < BLOCK_KV / 8; ++n) {
            p[n / 2][(n % 2) * 2 + 0] = pack_bf16x2(s[4 * n + 0], s[4 * n + 1]);
            p[n / 2][(n % 2) * 2 + 1] = pack_bf16x2(s[4 * n + 2], s[4 * n + 3]);
        }
    };
    auto rescale_o = [&](const float (&alpha)[2]) {
#pragma unroll
        for (int d = 0; d < HEAD_DIM / 8; ++d) {
            o_accumulator[4 * d + 0] *= alpha[0];
            o_accumulator[4 * d + 1] *= alpha[0];
            o_accumulator[4 * d + 2] *= alpha[1];
            o_accumulator[4 * d + 3] *= alpha[1];
        }
    };

    // S = Q K^T and O += P V, issued without waiting (the caller fences and commits).
    auto issue_s = [&](float (&s)[BLOCK_KV / 2], int stage) {
#pragma unroll
        for (int step = 0; step < QK_STEPS; ++step)
            Wgmma<BLOCK_KV>::template ss<0, 0>(s, q_descriptor(step), k_descriptor(stage, step), step > 0);
    };
    auto issue_pv = [&](int stage) {
#pragma unroll
        for (int step = 0; step < PV_STEPS; ++step)
            Wgmma<HEAD_DIM>::template rs<1>(o_accumulator, p[step], v_descriptor(stage, step), 1);
    };
    // One arrival per warp tells the producer that the stage's K (or V) may be refilled.
    auto release = [&](uint64_t* empty) {
        __syncwarp();
        if (lane == 0) mbarrier_arrive(empty);
    };
    // Ping-pong: the consumer warpgroups take turns at issuing their wgmma, so that while one
    // warpgroup's GEMMs run on the tensor cores the others compute their softmax. Warpgroup w
    // waits on named barrier TURN + w, which the warpgroup before it (w - 1, cyclically) arrives
    // at once it has issued. 256 threads: the 128 that wait and the 128 that arrive.
    constexpr int TURN = 1 + Config::CONSUMERS;  // ids 1 .. CONSUMERS are the epilogue's
    auto wait_turn = [&] { named_barrier_sync(TURN + warpgroup, 256); };
    auto pass_turn = [&] { named_barrier_arrive(TURN + (warpgroup + 1) % Config::CONSUMERS, 256); };
    auto parity = [](int kv_tile) { return uint32_t(kv_tile / STAGES % 2); };

    float s[BLOCK_KV / 2];
    float alpha[2];
    mbarrier_wait(&q_full, 0);
    if (warpgroup == Config::CONSUMERS - 1) pass_turn();  // warpgroup 0 goes first

    // Tile 0: S_0 alone, then its softmax (O is still zero: nothing to rescale).
    mbarrier_wait(&k_full[0], 0);
    TIMELINE_STAMP(TIMELINE_TILE_READY, 0);
    wait_turn();
    TIMELINE_STAMP(TIMELINE_TURN, 0);
    fence_registers(s);
    wgmma_fence();
    issue_s(s, 0);
    wgmma_commit();
    pass_turn();
    TIMELINE_STAMP(TIMELINE_ISSUED, 0);
    wgmma_wait<0>();
    TIMELINE_STAMP(TIMELINE_S_DONE, 0);
    fence_registers(s);
    release(&k_empty[0]);
    mask(s, 0);
    softmax(s, alpha);
    TIMELINE_STAMP(TIMELINE_SOFTMAX_DONE, 0);
    pack_p(s);
    // Tile j: S_j = Q K_j^T and O += P_{j-1} V_{j-1} go to the tensor cores together, and the
    // softmax of S_j runs between the wait for the first and the wait for the second (at D = 128;
    // masked_softmax says why not at D = 64).
    for (int kv_tile = 1; kv_tile < kv_tiles; ++kv_tile) {
        const int stage = kv_tile % STAGES;
        const int previous = (kv_tile - 1) % STAGES;
        mbarrier_wait(&k_full[stage], parity(kv_tile));
        mbarrier_wait(&v_full[previous], parity(kv_tile - 1));
        TIMELINE_STAMP(TIMELINE_TILE_READY, kv_tile);
        wait_turn();
        TIMELINE_STAMP(TIMELINE_TURN, kv_tile);
        fence_registers(s);
        fence_registers(o_accumulator);
        wgmma_fence();
        issue_s(s, stage);
        wgmma_commit();
        issue_pv(previous);
        wgmma_commit();
        pass_turn();
        TIMELINE_STAMP(TIMELINE_ISSUED, kv_tile);
        wgmma_wait<1>();  // S_j is done; P_{j-1} V_{j-1} may still run
        TIMELINE_STAMP(TIMELINE_S_DONE, kv_tile);
        fence_registers(s);
        release(&k_empty[stage]);
        masked_softmax(s, alpha, kv_tile * BLOCK_KV);
        TIMELINE_STAMP(TIMELINE_SOFTMAX_DONE, kv_tile);
        wgmma_wait<0>();
        TIMELINE_STAMP(TIMELINE_PV_DONE, kv_tile - 1);
        fence_registers(o_accumulator);
        release(&v_empty[previous]);
        rescale_o(alpha);
        pack_p(s);
    }
    // The last O += P V. The last warpgroup passes no turn: nobody waits for it any more.
    const int last = (kv_tiles - 1) % STAGES;
    mbarrier_wait(&v_full[last], parity(kv_tiles - 1));
    TIMELINE_STAMP(TIMELINE_TILE_READY, kv_tiles);
    wait_turn();
    TIMELINE_STAMP(TIMELINE_TURN, kv_tiles);
    fence_registers(o_accumulator);
    wgmma_fence();
    issue_pv(last);
    wgmma_commit();
    if (warpgroup != Config::CONSUMERS - 1) pass_turn();
    TIMELINE_STAMP(TIMELINE_ISSUED, kv_tiles);
    wgmma_wait<0>();
    TIMELINE_STAMP(TIMELINE_PV_DONE, kv_tiles - 1);
    fence_registers(o_accumulator);
    release(&v_empty[last]);

    // Finish l over the quad and normalize. O goes through shared memory: the warpgroup's rows
    // of the Q tile (its last S = Q K^T has completed) take O in the same swizzled layout, and
    // one thread stores them with TMA, which writes only the rows inside the tensor.
    // LSE = m * scale + ln(l) goes straight from registers.
    bf16* o_tile = q_tile + warpgroup_row * 64;  // slab s of the warpgroup's rows: + s * BLOCK_Q * 64
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float sum = l[r];
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        sum += __shfl_xor_sync(FULL_MASK, sum, 2);
        const float inverse_sum = 1.0f / sum;
        const int tile_row = warp * 16 + fragment_row + r * 8;  // inside the warpgroup's 64
#pragma unroll
        for (int d = 0; d < HEAD_DIM / 8; ++d) {
            // Column 8d + fragment_column: 16-byte chunk d % 8 of slab d / 8, moved by the swizzle.
            const int chunk = (d % 8) ^ (tile_row % 8);
            *reinterpret_cast<__nv_bfloat162*>(o_tile + (d / 8) * BLOCK_Q * 64 + tile_row * 64 +
                                               chunk * 8 + fragment_column) =
                __floats2bfloat162_rn(o_accumulator[4 * d + 2 * r] * inverse_sum,
                                      o_accumulator[4 * d + 2 * r + 1] * inverse_sum);
        }
        const int row = q_start + warpgroup_row + tile_row;
        if (lse != nullptr && lane % 4 == 0 && row < len_q)
            lse[int64_t(head) * len_q + row] = m[r] * scale + logf(sum);
    }
    // The copy engine reads what ordinary stores wrote: fence, then the warpgroup's barrier
    // (named barrier 1 + warpgroup; 0 is __syncthreads), then one thread stores.
    fence_proxy_async_shared();
    named_barrier_sync(1 + warpgroup, 128);
    if (threadIdx.x % 128 == 0) {
        for (int slab = 0; slab < SLABS; ++slab)
            tma_store_3d(&o_map, o_tile + slab * BLOCK_Q * 64, slab * 64, q_start + warpgroup_row, head);
        bulk_commit();
        bulk_wait_read<0>();  // shared memory must outlive the copy's reads
    }
    TIMELINE_STAMP(TIMELINE_END, kv_tiles);
}

// Heads per group of the grid, as in stage 06: all of them when their K and V fit in L2
// together, else as many as fill half of it.
int heads_per_l2_group(const AttentionShape& shape) {
    int device = 0, l2_bytes = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
    const int64_t heads = int64_t(shape.batch) * shape.heads;
    const int64_t kv_bytes = 2 * int64_t(shape.len_kv) * shape.head_dim * int64_t(sizeof(bf16));
    if (heads * kv_bytes <= l2_bytes) return int(heads);
    return int(std::clamp<int64_t>(l2_bytes / 2 / kv_bytes, 1, heads));
}

// The driver's tensor-map encoder, looked up through the runtime so that the stage links
// without libcuda (CI builds it on machines without a driver).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void* function = nullptr;
        cudaDriverEntryPointQueryResult found{};
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                                    cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess || function == nullptr)
            throw std::runtime_error("attention: the driver has no cuTensorMapEncodeTiled");
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
    }();
    return encode;
}

// A [batch * heads][len][head_dim] bf16 tensor seen as 3-D (head_dim fastest), read in boxes of
// [box_rows][64] with the 128-byte swizzle. Rows past len (and heads past the last) are outside
// the tensor: TMA fills them with zeros instead of reading the next head.
CUtensorMap make_tensor_map(const bf16* tensor, int64_t batch_heads, int len, int head_dim, int box_rows) {
    CUtensorMap map{};
    const cuuint64_t dims[3] = {cuuint64_t(head_dim), cuuint64_t(len), cuuint64_t(batch_heads)};
    const cuuint64_t strides[2] = {cuuint64_t(head_dim) * sizeof(bf16),
                                   cuuint64_t(len) * head_dim * sizeof(bf16)};
    const cuuint32_t box[3] = {64, cuuint32_t(box_rows), 1};
    const cuuint32_t element_strides[3] = {1, 1, 1};
    const CUresult result = tensor_map_encoder()(
        &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16*>(tensor), dims, strides, box,
        element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (result != CUDA_SUCCESS)
        throw std::runtime_error("attention: cuTensorMapEncodeTiled failed with CUresult " +
                                 std::to_string(int(result)));
    return map;
}

template <class Config>
void launch(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
            const AttentionShape& shape, cudaStream_t stream) {
    const int batch_heads = shape.batch * shape.heads;
    const int q_tiles = ceil_div(shape.len_q, Config::BLOCK_Q);
    const int64_t blocks = int64_t(q_tiles) * batch_heads;
    if (blocks > INT_MAX)
        throw std::invalid_argument("attention: batch * heads * ceil(len_q / " +
                                    std::to_string(Config::BLOCK_Q) + ") = " +
                                    std::to_string(blocks) +
                                    " is not allowed: must be at most 2^31 - 1");
    const CUtensorMap q_map = make_tensor_map(q, batch_heads, shape.len_q, Config::HEAD_DIM, Config::BLOCK_Q);
    const CUtensorMap k_map = make_tensor_map(k, batch_heads, shape.len_kv, Config::HEAD_DIM, Config::BLOCK_KV);
    const CUtensorMap v_map = make_tensor_map(v, batch_heads, shape.len_kv, Config::HEAD_DIM, Config::BLOCK_KV);
    const CUtensorMap o_map = make_tensor_map(o, batch_heads, shape.len_q, Config::HEAD_DIM, 64);
    auto kernel = flash_forward_pingpong_kernel<Config>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(Config::SHARED_BYTES)));
    kernel<<<unsigned(blocks), Config::THREADS, Config::SHARED_BYTES, stream>>>(
        q_map, k_map, v_map, o_map, lse, batch_heads, heads_per_l2_group(shape), shape.len_q,
        shape.len_kv, q_tiles, shape.softmax_scale(), shape.causal);
    CUDA_CHECK_LAUNCH();
}

// ---- forward: end ---------------------------------------------------------------------------

// ---- backward ------------------------------------------------------------------------------
// With S = scale Q K^T, P = exp(S - LSE), dP = dO V^T and
// delta = rowsum(dO * O) = rowsum(P * dP):
//   dS = P * (dP - delta),   dV = P^T dO,   dK = scale dS^T Q,   dQ = scale dS K.
// The block keeps its keys' dK and dV in registers for the whole walk; dQ of a query tile gets
// a contribution from every block whose keys it sees, so it is added up in device memory.

// One configuration. Two consumer warpgroups own 64 keys each (wgmma's M); a query tile is
// BLOCK_Q rows, the N of S^T and dP^T. Its shared memory is laid out by BackwardSharedLayout.
template <int HEAD_DIM_>
struct BackwardTiling {
    static constexpr int HEAD_DIM = HEAD_DIM_;
    static constexpr int CONSUMERS = 2;
    static constexpr int THREADS = 128 * (1 + CONSUMERS);
    static constexpr int BLOCK_KV = 64 * CONSUMERS;  // Bc
    // Br: 128 queries at D = 64, where the registers hold two 64 x 128 score tiles (S^T, dP^T
    // with N = 128 keep the tensor cores fed from shared memory, and a consumer waits and hands
    // dQ over half as often per query); 64 at D = 128, where dK and dV take 128 of them.
    static constexpr int BLOCK_Q = HEAD_DIM == 64 ? 128 : 64;
    static constexpr int STAGES = 2;
    static constexpr int SLABS = HEAD_DIM / 64;
    static constexpr int PRODUCER_REGISTERS = 24;
    static constexpr int CONSUMER_REGISTERS = 240;
    static constexpr uint32_t KV_BYTES = BLOCK_KV * HEAD_DIM * sizeof(bf16);
    static constexpr uint32_t Q_BYTES = BLOCK_Q * HEAD_DIM * sizeof(bf16);
    static constexpr uint32_t ROW_BYTES = BLOCK_Q * sizeof(float);  // BLOCK_Q LSE or delta values
    // dQ = dS K over all the block's keys, so that the block adds each dQ element to device
    // memory once per query tile: the BLOCK_Q x HEAD_DIM block is cut into 64 x 64 pieces, one
    // per consumer (at D = 64 consumer g takes queries 64 g .. 64 g + 63, at D = 128 columns
    // 64 g .. 64 g + 63). Each consumer reads both halves of dS^T, so dS^T is double-buffered.
    static constexpr int Q_SLABS = BLOCK_Q / 64;     // of dS^T's queries
    static_assert(Q_SLABS * SLABS == CONSUMERS, "one 64 x 64 piece of dQ per consumer");
    static constexpr uint32_t DS_BYTES = BLOCK_KV * BLOCK_Q * sizeof(bf16);  // both halves of dS^T
    static constexpr uint32_t DQ_BYTES = 64 * 64 * sizeof(float);            // one consumer's piece
    // rowsum(dS) rides on the dQ GEMM as 8 more columns of B: the tile of ones is laid out like a
    // slab of K, [BLOCK_KV keys][64], of which the GEMM reads 8 columns. One piece per query slab
    // needs them, the slab's first (consumer g < Q_SLABS): at D = 64 both consumers' pieces, at
    // D = 128 consumer 0's only, since consumer 1's piece has the same queries; its GEMM is
    // N = 64, 8 columns fewer, and the row sums it hands over stay 0.
    static constexpr uint32_t ONES_BYTES = BLOCK_KV * 64 * sizeof(bf16);
    __host__ __device__ static constexpr bool sums_rows(int consumer) { return consumer < Q_SLABS; }
    static constexpr uint32_t RS_BYTES = 64 * sizeof(float);                 // a piece's 64 row sums
    // At D = 128 a consumer makes its staged piece of dQ visible to the writer (the proxy fence,
    // which waits for the stores to land, and the arrival) in the next tile, once its dP^T is
    // done, instead of between its gradients and its next turn; at D = 64 that measured 3-4%
    // slower, and the piece is handed over at once (lab notes 11).
    static constexpr bool LATE_PUBLISH = HEAD_DIM == 128;
    static constexpr bool DETERMINISTIC = false;  // the adds into device memory in any order
};

// The same kernel for AttentionShape::deterministic: dQ and the dS row sums added as integers,
// the K column sums per block (DeterministicSums). A type of its own, and every difference under
// `if constexpr (Config::DETERMINISTIC)`, so that the default kernel keeps its instructions
// (lab notes 11: the same SASS as before the mode, the unused DeterministicSums parameter apart).
template <int HEAD_DIM_>
struct DeterministicBackwardTiling : BackwardTiling<HEAD_DIM_> {
    static constexpr bool DETERMINISTIC = true;
};

// What the deterministic kernel reads besides the default's, in the workspace (the default
// kernel gets null pointers and reads none of them): each query row's scales into fixed point
// (dq_fixed_point.h), by which its pieces of dQ and of the dS row sums become integers, and a
// row per block and consumer for the K column sums, which backward_fold_key_sums_kernel adds up in
// block order (the default kernel adds them by atomics as it goes).
struct DeterministicSums {
    const float2* row_scales;  // [padded rows]: dQ's scale, then the dS row sums'
    float* key_partials;       // [head][key block][consumer][HEAD_DIM]: K column sums
};

// By default, where the main kernel's grid takes PROGRESSIVE_MIN_ROUNDS rounds of the GPU or more,
// the conversion of dQ (backward_convert_dq_kernel) runs beside its last blocks and converts each
// head as soon as its sums are whole. head_done[head] (in the zeroed part of the workspace) counts
// the head's dQ writers that are done: the writer's last reduce-add has completed and its
// consumer's K column sums are added, HEAD_ARRIVALS a block. With fewer rounds every head ends
// with the grid, there is nothing to convert beside it, and head_done is null: nobody counts and
// the conversion waits for the grid.
template <class Config>
constexpr uint32_t HEAD_ARRIVALS = Config::CONSUMERS;
constexpr int PROGRESSIVE_MIN_ROUNDS = 3;

// setmaxnreg moves registers between the warpgroups within what the block was given at launch,
// 168 x 384 (__launch_bounds__): an increase beyond it would wait forever.
template <class Config>
constexpr bool fits_block_registers =
    Config::PRODUCER_REGISTERS * 128 + Config::CONSUMER_REGISTERS * 128 * Config::CONSUMERS <= 168 * Config::THREADS;
static_assert(fits_block_registers<BackwardTiling<64>> && fits_block_registers<BackwardTiling<128>>);

// The backward kernel's dynamic shared memory, its regions in the order they lie: offsets from
// the 1024-byte aligned base, each the previous one plus the previous region's size.
template <class Config>
struct BackwardSharedLayout {
    // K and V of the block, [SLABS][BLOCK_KV][64] each, loaded once.
    static constexpr size_t K_TILE = 0;
    static constexpr size_t V_TILE = K_TILE + Config::KV_BYTES;
    // The producer's ring: Q and dO of STAGES query tiles, [STAGES][SLABS][BLOCK_Q][64] each.
    static constexpr size_t Q_TILES = V_TILE + Config::KV_BYTES;
    static constexpr size_t DO_TILES = Q_TILES + Config::STAGES * Config::Q_BYTES;
    // dS^T of two query tiles for dQ = dS K, [2][Q_SLABS][BLOCK_KV keys][64 queries].
    static constexpr size_t DS_TILES = DO_TILES + Config::STAGES * Config::Q_BYTES;
    // Each consumer's 64 x 64 FP32 piece of dQ, the source of its bulk reduce-add.
    static constexpr size_t DQ_STAGING = DS_TILES + 2 * Config::DS_BYTES;
    // rowsum(dS) for the centred dQ: the dQ GEMM's B goes on past its slab of K into a tile of
    // ones, [BLOCK_KV keys][64] like a slab of K (every value the same: the swizzle cannot matter).
    static constexpr size_t ONES = DQ_STAGING + Config::CONSUMERS * Config::DQ_BYTES;
    // Each consumer's 64 row sums of dS (its piece's queries; at D = 128 half of each sum), the
    // source of their bulk reduce-add.
    static constexpr size_t ROWSUM_STAGING = ONES + Config::ONES_BYTES;
    // LSE log2 e and delta of the ring's query tiles, [STAGES][BLOCK_Q] each.
    static constexpr size_t LSE_ROWS = ROWSUM_STAGING + Config::CONSUMERS * Config::RS_BYTES;
    static constexpr size_t DELTA_ROWS = LSE_ROWS + Config::STAGES * Config::ROW_BYTES;
    // For the exact delta: two buffers of per-warp column sums, [2][consumer warps][BLOCK_Q],
    // and each consumer's copy of the sums, [CONSUMERS][BLOCK_Q].
    static constexpr size_t DELTA_PARTIALS = DELTA_ROWS + Config::STAGES * Config::ROW_BYTES;
    static constexpr size_t EXACT_DELTA = DELTA_PARTIALS + 2 * 4 * Config::CONSUMERS * Config::ROW_BYTES;
    // Each consumer's three mbarriers with its dQ writer, `staged`, `free` and `key_sums`
    // ([3][CONSUMERS], DqWriter): at a fixed offset from the base, so that the writer, short of
    // registers, need not hold their addresses.
    static constexpr size_t DQ_WRITER = EXACT_DELTA + Config::CONSUMERS * Config::ROW_BYTES;
    // The dynamic shared memory to ask for: the regions and up to 1024 bytes of rounding the base.
    static constexpr size_t BYTES =
        DQ_WRITER + 3 * Config::CONSUMERS * sizeof(uint64_t) + 1024;

    // wgmma's operands start on the swizzle atom (1024 bytes), the FP32 rows where TMA may
    // write them and the copy engine read them (128 bytes).
    static_assert(K_TILE % 1024 == 0 && V_TILE % 1024 == 0 && Q_TILES % 1024 == 0 && DO_TILES % 1024 == 0 &&
                      DS_TILES % 1024 == 0 && ONES % 1024 == 0 && Config::Q_BYTES % 1024 == 0 &&
                      Config::DS_BYTES % 1024 == 0,
                  "swizzled tiles on 1024-byte boundaries");
    static_assert(DQ_STAGING % 128 == 0 && ROWSUM_STAGING % 128 == 0 && LSE_ROWS % 128 == 0 &&
                      DELTA_ROWS % 128 == 0 && DELTA_PARTIALS % 128 == 0 && EXACT_DELTA % 128 == 0 &&
                      Config::DQ_BYTES % 128 == 0 && Config::ROW_BYTES % 128 == 0 && Config::RS_BYTES % 128 == 0,
                  "FP32 rows on 128-byte boundaries");
    static_assert(BYTES <= 227 * 1024, "at most 227 KiB of shared memory per block");
};

// The mbarriers of a consumer and its dQ writer (write_dq), in the
// shared memory at BackwardSharedLayout::DQ_WRITER. `staged` completes a phase when all 128
// threads of the consumer have stored a piece of dQ in its staging tile; `free` when the
// writer's reduce-add has read it; `key_sums` (one phase, by default only) when the consumer's
// K column sums are added.
template <class Config>
struct DqWriter {
    static __device__ __forceinline__ uint64_t* staged(unsigned char* base, int consumer) {
        return reinterpret_cast<uint64_t*>(base + BackwardSharedLayout<Config>::DQ_WRITER) + consumer;
    }
    static __device__ __forceinline__ uint64_t* free(unsigned char* base, int consumer) {
        return staged(base, Config::CONSUMERS + consumer);
    }
    static __device__ __forceinline__ uint64_t* key_sums(unsigned char* base, int consumer) {
        return staged(base, 2 * Config::CONSUMERS + consumer);
    }
};

// Per query row, into arrays padded to whole query tiles (BLOCK_Q rows) per head (so that every tile the
// producer copies starts on a 16-byte boundary and never reaches into the next head):
// delta = rowsum(dO * O) and LSE log2 e. Padding rows get 0. HEAD_DIM / 8 threads per row, each
// reading 8 elements (16 bytes) of O and of dO, so that a warp reads whole lines of several rows.
// The same kernel clears what the main kernel adds into (`zeroed`, zeroed_float4s of them), so
// that no memset runs between the two, and lets the main kernel start early
// (allow_dependent_launch: its blocks wait for this grid with wait_for_prior_grid).
// FIXED_POINT (the deterministic mode): also each row's scales (dq_fixed_point.h) from |O_i|,
// |dO_i| and its head's bounds on K and V, which backward_kv_bounds_kernel has just found.
constexpr int PREPROCESS_THREADS = 256;

// Elements 2i and 2i + 1 of eight bf16 read as one 16-byte load.
__device__ __forceinline__ float2 bf16_pair(const uint4& eight, int i) {
    const uint32_t word = i == 0 ? eight.x : i == 1 ? eight.y : i == 2 ? eight.z : eight.w;
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&word));
}

template <int HEAD_DIM, bool FIXED_POINT>
__global__ void __launch_bounds__(PREPROCESS_THREADS)
backward_preprocess_kernel(const bf16* __restrict__ O, const bf16* __restrict__ dO,
                           const float* __restrict__ lse, float* __restrict__ delta,
                           float* __restrict__ lse_log2, int len_q, int padded_len_q,
                           int64_t padded_rows, float4* __restrict__ zeroed, int64_t zeroed_float4s,
                           const float2* __restrict__ kv_bounds, float2* __restrict__ row_scales) {
    allow_dependent_launch();
    constexpr int ROW_THREADS = HEAD_DIM / 8;
    constexpr int ROWS_PER_WARP = 32 / ROW_THREADS;
    const int lane = int(threadIdx.x) % 32;
    const int part = lane % ROW_THREADS;  // elements 8 part .. 8 part + 7 of the row
    const int64_t warps = int64_t(gridDim.x) * (PREPROCESS_THREADS / 32);
    int64_t bounds_head = -1;  // FIXED_POINT: the head whose largest |K| and |V_j| these are
    float key_max = 0.0f, value_norm_max = 0.0f;
    auto zero = [&] {
        for (int64_t i = int64_t(blockIdx.x) * PREPROCESS_THREADS + threadIdx.x; i < zeroed_float4s;
             i += int64_t(gridDim.x) * PREPROCESS_THREADS)
            zeroed[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    };
    if constexpr (FIXED_POINT) {  // zero while the bounds may still be found, then wait for them
        zero();
        wait_for_prior_grid();
    }
    // The loop runs alike for the whole warp (the shuffles below need every lane). A warp's
    // ROWS_PER_WARP rows are of one head: padded_len_q is a multiple of 64.
    for (int64_t first = (int64_t(blockIdx.x) * (PREPROCESS_THREADS / 32) + threadIdx.x / 32) * ROWS_PER_WARP;
         first < padded_rows; first += warps * ROWS_PER_WARP) {
        const int64_t padded = first + lane / ROW_THREADS;
        const int64_t head = padded / padded_len_q;
        const int query = int(padded % padded_len_q);
        const bool real = padded < padded_rows && query < len_q;
        const int64_t row = head * len_q + query;
        float sum = 0.0f, o_norm2 = 0.0f, do_norm2 = 0.0f;
        if (real) {
            const uint4 o = *reinterpret_cast<const uint4*>(O + row * HEAD_DIM + part * 8);
            const uint4 g = *reinterpret_cast<const uint4*>(dO + row * HEAD_DIM + part * 8);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float2 a = bf16_pair(o, i), b = bf16_pair(g, i);
                sum += a.x * b.x + a.y * b.y;
                if constexpr (FIXED_POINT) {
                    o_norm2 += a.x * a.x + a.y * a.y;
                    do_norm2 += b.x * b.x + b.y * b.y;
                }
            }
        }
#pragma unroll
        for (int offset = ROW_THREADS / 2; offset > 0; offset /= 2) {
            sum += __shfl_xor_sync(FULL_MASK, sum, offset);
            if constexpr (FIXED_POINT) {
                o_norm2 += __shfl_xor_sync(FULL_MASK, o_norm2, offset);
                do_norm2 += __shfl_xor_sync(FULL_MASK, do_norm2, offset);
            }
        }
        if constexpr (FIXED_POINT) {
            const int64_t warp_head = first / padded_len_q;
            if (warp_head != bounds_head) {  // the same for the whole warp
                static_assert(KV_BOUND_CHUNKS == 32, "a lane per chunk");
                const float2 chunk = kv_bounds[warp_head * KV_BOUND_CHUNKS + lane];
                key_max = chunk.x, value_norm_max = chunk.y;
#pragma unroll
                for (int offset = 16; offset > 0; offset /= 2) {
                    key_max = fmaxf(key_max, __shfl_xor_sync(FULL_MASK, key_max, offset));
                    value_norm_max = fmaxf(value_norm_max, __shfl_xor_sync(FULL_MASK, value_norm_max, offset));
                }
                bounds_head = warp_head;
            }
        }
        if (part == 0 && padded < padded_rows) {
            delta[padded] = sum;
            lse_log2[padded] = real ? lse[row] * LOG2E : 0.0f;
            if constexpr (FIXED_POINT) {
                const float rowsum_bound = sqrtf(do_norm2) * (value_norm_max + sqrtf(o_norm2));
                row_scales[padded] = make_float2(fixed_point_scale(rowsum_bound * key_max),
                                                 fixed_point_scale(rowsum_bound));
            }
        }
    }
    if constexpr (!FIXED_POINT) zero();
}

// Deterministic mode, first of the call's kernels: for each head and each of KV_BOUND_CHUNKS
// runs of its keys (an item, one block at a time), the largest |K| element and the largest row
// norm |V_j|, the Kmax and Vmax of dq_fixed_point.h's bound; the preprocessing takes a head's
// largest.
template <int HEAD_DIM>
__global__ void __launch_bounds__(PREPROCESS_THREADS)
backward_kv_bounds_kernel(const bf16* __restrict__ K, const bf16* __restrict__ V, int len_kv, int64_t items,
                          float2* __restrict__ kv_bounds) {
    allow_dependent_launch();
    constexpr int ROW_THREADS = HEAD_DIM / 8, ROWS = PREPROCESS_THREADS / ROW_THREADS;
    const int part = int(threadIdx.x) % ROW_THREADS;  // elements 8 part .. 8 part + 7 of the row
    const int chunk_keys = ceil_div(len_kv, KV_BOUND_CHUNKS);
    __shared__ float2 warp_max[PREPROCESS_THREADS / 32];
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
        const int64_t head = item / KV_BOUND_CHUNKS;
        const int first = int(item % KV_BOUND_CHUNKS) * chunk_keys;
        const int end = min(len_kv, first + chunk_keys);
        float key_max = 0.0f, value_norm2_max = 0.0f;
        // Alike for the whole warp (the shuffles need every lane); keys past `end` count as
        // zeros. UNROLL rows per thread and pass, their loads issued together.
        constexpr int UNROLL = 4;
        for (int base = first; base < end; base += UNROLL * ROWS) {
            uint4 k[UNROLL], v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int key = base + u * ROWS + int(threadIdx.x) / ROW_THREADS;
                k[u] = v[u] = make_uint4(0, 0, 0, 0);
                if (key < end) {
                    const int64_t offset = (head * len_kv + key) * HEAD_DIM + part * 8;
                    k[u] = *reinterpret_cast<const uint4*>(K + offset);
                    v[u] = *reinterpret_cast<const uint4*>(V + offset);
                }
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                float value_norm2 = 0.0f;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float2 a = bf16_pair(k[u], i), b = bf16_pair(v[u], i);
                    key_max = fmaxf(key_max, fmaxf(fabsf(a.x), fabsf(a.y)));
                    value_norm2 += b.x * b.x + b.y * b.y;
                }
#pragma unroll
                for (int offset = ROW_THREADS / 2; offset > 0; offset /= 2)
                    value_norm2 += __shfl_xor_sync(FULL_MASK, value_norm2, offset);
                value_norm2_max = fmaxf(value_norm2_max, value_norm2);
            }
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) {
            key_max = fmaxf(key_max, __shfl_xor_sync(FULL_MASK, key_max, offset));
            value_norm2_max = fmaxf(value_norm2_max, __shfl_xor_sync(FULL_MASK, value_norm2_max, offset));
        }
        if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = make_float2(key_max, value_norm2_max);
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < PREPROCESS_THREADS / 32; ++w)
                key_max = fmaxf(key_max, warp_max[w].x), value_norm2_max = fmaxf(value_norm2_max, warp_max[w].y);
            kv_bounds[item] = make_float2(key_max, sqrtf(value_norm2_max));
        }
        __syncthreads();  // warp_max is read before the next item writes it
    }
}

// The dQ accumulator holds, per (head, 64 query rows), the 64 x HEAD_DIM block as 64-column
// parts in the order the consumers' wgmma accumulators come out: in part g, float4 number
// (warp * 8 + i) * 32 + lane holds registers 4i .. 4i + 3 of that lane, i.e. rows
// 16 warp + lane / 4 and 8 more, columns 64 g + 8i + 2 (lane % 4) and one more. Each thread then stages its dQ with 16-byte stores that no
// two lanes of a warp aim at the same bank, and the block is one contiguous range for the
// bulk reduce-add. This kernel puts the rows back in order, scales and rounds them, and
// subtracts rowsum(dS) times the mean of K (see `centred dQ` in the kernel below): key_sum times
// inverse_len_kv, or a caller's key_centre with inverse_len_kv = 1. Here a tile is 64 rows:
// row_tiles of them per head; a thread converts a float4.
// It is launched while the main kernel's last blocks still run. BESIDE (by default, where the
// main grid takes PROGRESSIVE_MIN_ROUNDS rounds or more): its blocks start, in order, on the SMs
// those leave idle, and a block's float4s are converted once their head's blocks have counted
// HEAD_ARRIVALS each in head_done (the main kernel's heads end in order too), so that only the
// last heads wait for the grid's end. Otherwise every block waits for the grid first. Small
// blocks, as the SMs that a short grid leaves idle hold the first of them, and those convert
// their share alone once the grid ends.
// FIXED_POINT (the deterministic mode): the accumulator and the row sums hold integers, each
// row's scaled by its row_scales (dq_fixed_point.h), undone here exactly; it runs after the fold
// of the K column sums, and waits for it first.
constexpr int CONVERT_THREADS = 256;

template <int HEAD_DIM, bool FIXED_POINT, bool BESIDE>
__global__ void __launch_bounds__(CONVERT_THREADS)
backward_convert_dq_kernel(const float* __restrict__ dq_accumulator, const float* __restrict__ ds_rowsum,
                           const float* __restrict__ key_sum, bf16* __restrict__ dQ, int64_t float4s, int len_q,
                           int row_tiles, float inverse_len_kv, float scale, const float2* __restrict__ row_scales,
                           const uint32_t* head_done, uint32_t head_arrivals) {
    constexpr int TILE_FLOAT4S = 64 * HEAD_DIM / 4;
    static_assert(TILE_FLOAT4S % CONVERT_THREADS == 0, "a block's float4s in one tile");
    static_assert(!(FIXED_POINT && BESIDE), "the deterministic conversion runs after the fold");
    // Beside the main kernel the sums are still being made in L2 by other blocks: loads past L1
    // (.cg). Otherwise they are final and read through the read-only path, as any input.
    const auto load = [](const auto* address) {
        if constexpr (BESIDE) return __ldcg(address); else return __ldg(address);
    };
    if constexpr (!BESIDE) wait_for_prior_grid();  // the main kernel, or (FIXED_POINT) the fold of the K column sums
    for (int64_t f = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; f < float4s;
         f += int64_t(gridDim.x) * blockDim.x) {
        const int64_t tile = f / TILE_FLOAT4S;
        const int64_t head = tile / row_tiles;
        // excerpt: convert-beside
        if constexpr (BESIDE) {  // the block's float4s are of one head: wait until its blocks have all counted
            if (threadIdx.x == 0)
                while (load_acquire_gpu(head_done + head) < head_arrivals) __nanosleep(256);
            __syncthreads();  // orders the acquire before every thread's loads below
        }
        // end excerpt
        const int within = int(f % TILE_FLOAT4S);
        const int part = within / 1024, rest = within % 1024;
        const int warp = rest / 256;
        const int i = rest / 32 % 8;
        const int lane = rest % 32;
        const int row = int(tile % row_tiles) * 64 + warp * 16 + lane / 4;
        const int column = part * 64 + i * 8 + 2 * (lane % 4);
        const float* rowsum = ds_rowsum + head * row_tiles * 64;
        float4 value;
        float rowsum0, rowsum8;  // rows `row` and row + 8
        if constexpr (FIXED_POINT) {
            const int4 sums = reinterpret_cast<const int4*>(dq_accumulator)[f];
            const float2 scale0 = row_scales[head * row_tiles * 64 + row];
            const float2 scale8 = row_scales[head * row_tiles * 64 + row + 8];
            const float unscale0 = 1.0f / scale0.x, unscale8 = 1.0f / scale8.x;  // powers of two: exact
            value = make_float4(float(sums.x) * unscale0, float(sums.y) * unscale0, float(sums.z) * unscale8,
                                float(sums.w) * unscale8);
            const int* rowsum_sums = reinterpret_cast<const int*>(rowsum);
            rowsum0 = float(rowsum_sums[row]) * (1.0f / scale0.y);
            rowsum8 = float(rowsum_sums[row + 8]) * (1.0f / scale8.y);
        } else {
            value = load(reinterpret_cast<const float4*>(dq_accumulator) + f);
            rowsum0 = load(rowsum + row);
            rowsum8 = load(rowsum + row + 8);
        }
        const float mean0 = load(key_sum + head * HEAD_DIM + column) * inverse_len_kv;
        const float mean1 = load(key_sum + head * HEAD_DIM + column + 1) * inverse_len_kv;
        if (row < len_q)
            *reinterpret_cast<__nv_bfloat162*>(dQ + (head * len_q + row) * HEAD_DIM + column) =
                __floats2bfloat162_rn((value.x - rowsum0 * mean0) * scale, (value.y - rowsum0 * mean1) * scale);
        if (row + 8 < len_q)
            *reinterpret_cast<__nv_bfloat162*>(dQ + (head * len_q + row + 8) * HEAD_DIM + column) =
                __floats2bfloat162_rn((value.z - rowsum8 * mean0) * scale, (value.w - rowsum8 * mean1) * scale);
    }
    // Beside the main kernel, that one may still be writing dK and dV (its blocks exit once the
    // copy engine has read them): this grid ends after it, as the stream's order promises. One
    // block waits, the last (each waiting block would keep its SM from the next ones).
    if (BESIDE && blockIdx.x == gridDim.x - 1) wait_for_prior_grid();
}

// Deterministic mode, between the backward kernel and the conversion: each head's K column sums
// from its blocks' partial sums in a fixed order (the default kernel adds them in device memory
// as it goes, in any order). A warp per column: lane l adds partials l, l + 32, ... in turn, then
// the lanes' sums meet in a fixed tree of shuffles.
constexpr int FOLD_THREADS = 256;

template <int HEAD_DIM>
__global__ void __launch_bounds__(FOLD_THREADS)
backward_fold_key_sums_kernel(float* __restrict__ key_sum, const float* __restrict__ key_partials,
                              int64_t batch_heads, int partials_per_head) {
    const int lane = int(threadIdx.x) % 32;
    const int64_t warps = int64_t(gridDim.x) * (FOLD_THREADS / 32);
    for (int64_t i = int64_t(blockIdx.x) * (FOLD_THREADS / 32) + threadIdx.x / 32; i < batch_heads * HEAD_DIM;
         i += warps) {  // alike for the whole warp
        const int64_t head = i / HEAD_DIM;
        const float* partial = key_partials + head * partials_per_head * HEAD_DIM + i % HEAD_DIM;
        float sum = 0.0f;
        for (int p = lane; p < partials_per_head; p += 32) sum += partial[int64_t(p) * HEAD_DIM];
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(FULL_MASK, sum, offset);
        if (lane == 0) key_sum[i] = sum;
    }
}

// The backward kernel, by role. flash_backward_kernel (at the end) sets up the block
// (BackwardBlock) and hands its warpgroups to their roles: the producer (backward_producer) and
// the two consumers (backward_consumer, which walks the query tiles with the steps of
// ConsumerWarpgroup). Every function is forceinline: ptxas serializes a wgmma pipeline that
// crosses a call.

// One block of the backward: BLOCK_KV keys of one (batch, head), its linear index head *
// kv_tiles + key tile (blockIdx.x). What
// its producer and its consumers both read: where the tiles lie in shared
// memory, the ring's mbarriers, the block's keys and query tiles, and who this thread is.
struct BackwardBlock {
    unsigned char* base;  // the dynamic shared memory from its first 1024-byte boundary
    bf16* k_tile;         // [SLABS][BLOCK_KV][64]
    bf16* v_tile;         // [SLABS][BLOCK_KV][64]
    bf16* q_tiles_smem;   // [STAGES][SLABS][BLOCK_Q][64]
    bf16* do_tiles;       // [STAGES][SLABS][BLOCK_Q][64]
    float* lse_rows;      // [STAGES][BLOCK_Q]
    float* delta_rows;    // [STAGES][BLOCK_Q]
    bf16* ones;           // [BLOCK_KV][64], the last 8 columns of dQ's B: the row sums of dS (see issue_dq)
    uint64_t* kv_full;    // K and V have landed
    uint64_t* q_full;     // [STAGES] the stage's Q, dO, LSE and delta have landed
    uint64_t* q_empty;    // [STAGES] every consumer warp is done with the stage
    int head;
    int kv_start;         // the block's first key
    int q_tiles;
    int first_q_tile;     // causal: the first query tile that sees any of the block's keys
    int warpgroup;        // -1: the producer; 0, 1: consumers
    int warp;             // inside the warpgroup
    int lane;
    // wgmma accumulators: this thread holds rows fragment_row and fragment_row + 8 of its warp's
    // 16, columns 8i + fragment_column and one more.
    int fragment_row;
    int fragment_column;
};

template <class Config>
__device__ __forceinline__ BackwardBlock make_backward_block(unsigned char* base, uint64_t* kv_full,
                                                             uint64_t* q_full, uint64_t* q_empty,
                                                             int kv_tiles, int q_tiles, bool causal,
                                                             int linear_block) {
    using Shared = BackwardSharedLayout<Config>;  // offsets into the dynamic shared memory
    BackwardBlock block;
    block.base = base;
    block.k_tile = reinterpret_cast<bf16*>(base + Shared::K_TILE);
    block.v_tile = reinterpret_cast<bf16*>(base + Shared::V_TILE);
    block.q_tiles_smem = reinterpret_cast<bf16*>(base + Shared::Q_TILES);
    block.do_tiles = reinterpret_cast<bf16*>(base + Shared::DO_TILES);
    block.lse_rows = reinterpret_cast<float*>(base + Shared::LSE_ROWS);
    block.delta_rows = reinterpret_cast<float*>(base + Shared::DELTA_ROWS);
    block.ones = reinterpret_cast<bf16*>(base + Shared::ONES);
    block.kv_full = kv_full;
    block.q_full = q_full;
    block.q_empty = q_empty;
    block.head = linear_block / kv_tiles;
    block.kv_start = (linear_block % kv_tiles) * Config::BLOCK_KV;
    block.q_tiles = q_tiles;
    // Read from lane 0 so that the compiler knows it is the same across the warp and keeps what
    // is derived from it (descriptors) in uniform registers.
    block.warpgroup = __shfl_sync(FULL_MASK, int(threadIdx.x) / 128, 0) - 1;
    block.warp = int(threadIdx.x) % 128 / 32;
    block.lane = int(threadIdx.x) % 32;
    block.fragment_row = block.lane / 4;
    block.fragment_column = 2 * (block.lane % 4);
    // Causal: query tiles whose last row comes before the block's first key see none of them.
    block.first_q_tile = causal ? min(block.kv_start / Config::BLOCK_Q, q_tiles) : 0;
    return block;
}

// The producer, one thread: K and V once, then Q, dO, LSE and delta of every query tile the
// keys can see, through the ring of STAGES stages.
template <class Config>
__device__ __forceinline__ void backward_producer(const BackwardBlock& block, const CUtensorMap& q_map,
                                                  const CUtensorMap& k_map, const CUtensorMap& v_map,
                                                  const CUtensorMap& do_map, const CUtensorMap& lse_map,
                                                  const CUtensorMap& delta_map) {
    constexpr int BLOCK_Q = Config::BLOCK_Q, BLOCK_KV = Config::BLOCK_KV;
    constexpr int STAGES = Config::STAGES, SLABS = Config::SLABS;
    const int head = block.head, q_tiles = block.q_tiles;
    uint64_t* q_full = block.q_full;
    uint64_t* q_empty = block.q_empty;
    TIMELINE_BEGIN;  // the phase stamps (common/timeline.cuh): nothing unless measured
    TIMELINE_STAMP_AS(block.warpgroup, TIMELINE_START, block.first_q_tile);
    mbarrier_arrive_expect_tx(block.kv_full, 2 * Config::KV_BYTES);
    for (int slab = 0; slab < SLABS; ++slab) {
        tma_load_3d(block.k_tile + slab * BLOCK_KV * 64, &k_map, slab * 64, block.kv_start, head, block.kv_full);
        tma_load_3d(block.v_tile + slab * BLOCK_KV * 64, &v_map, slab * 64, block.kv_start, head, block.kv_full);
    }
    wait_for_prior_grid();  // the preprocessing's delta, LSE and zeroed sums from here on
    allow_dependent_launch();
    // excerpt: producer
    for (int q_tile = block.first_q_tile, load = 0; q_tile < q_tiles; ++q_tile, ++load) {
        const int stage = load % STAGES;
        mbarrier_wait(&q_empty[stage], (load / STAGES + 1) % 2);
        mbarrier_arrive_expect_tx(&q_full[stage], 2 * Config::Q_BYTES + 2 * Config::ROW_BYTES);
        for (int slab = 0; slab < SLABS; ++slab) {
            const int offset = (stage * SLABS + slab) * BLOCK_Q * 64;
            tma_load_3d(block.q_tiles_smem + offset, &q_map, slab * 64, q_tile * BLOCK_Q, head, &q_full[stage]);
            tma_load_3d(block.do_tiles + offset, &do_map, slab * 64, q_tile * BLOCK_Q, head, &q_full[stage]);
        }
        // LSE log2 e and delta, padded to whole tiles per head by the preprocessing kernel.
        const int row = (head * q_tiles + q_tile) * BLOCK_Q;
        tma_load_2d(block.lse_rows + stage * BLOCK_Q, &lse_map, row, 0, &q_full[stage]);
        tma_load_2d(block.delta_rows + stage * BLOCK_Q, &delta_map, row, 0, &q_full[stage]);
        TIMELINE_STAMP_AS(block.warpgroup, TIMELINE_LOADED, q_tile);
    }
    // end excerpt
    TIMELINE_STAMP_AS(block.warpgroup, TIMELINE_END, q_tiles);
}

// One consumer warpgroup: its 64 keys, its descriptors and staging tiles, and the steps of its
// walk over the query tiles, which backward_consumer (below) takes in order. Its fields are set
// by make_consumer_warpgroup.
template <class Config, bool SUMS_ROWS>
struct ConsumerWarpgroup : BackwardBlock {
    static constexpr int HEAD_DIM = Config::HEAD_DIM, BLOCK_Q = Config::BLOCK_Q, BLOCK_KV = Config::BLOCK_KV;
    static constexpr int DQ_N = SUMS_ROWS ? 64 + 8 : 64;  // dQ's piece, then (SUMS_ROWS) dS 1
    static constexpr int SLABS = Config::SLABS;
    static constexpr int D_STEPS = HEAD_DIM / 16;    // k-steps over the head dim (S^T, dP^T)
    static constexpr int Q_STEPS = BLOCK_Q / 16;     // k-steps over the queries (dV, dK)
    static constexpr int KEY_STEPS = BLOCK_KV / 16;  // k-steps of dQ (over the keys)
    using Shared = BackwardSharedLayout<Config>;     // offsets into the dynamic shared memory

    float* dq_accumulator;
    float* ds_rowsum;
    int len_q, len_kv;
    float scale;
    float scale_log2;  // scale log2 e
    bool causal;
    // Exact delta. When one block holds every key, it can sum P * dP over them itself instead
    // of using the rounded O; at tiny lengths a nearly one-hot row makes the true dS so small
    // that the rounding of delta would dominate it.
    bool exact_delta;
    float* delta_partials;  // two buffers of [consumer warps][BLOCK_Q] partials

    int key_row;            // this consumer's 64 keys: rows key_row .. key_row + 63 of the K and V tiles
    bf16* ds_tiles;         // [2][Q_SLABS][BLOCK_KV keys][64]
    float* dq_staging;      // this consumer's 64 x 64 piece of dQ
    float* rowsum_staging;  // the row sums of dS of this consumer's piece (its 64 queries)

    // Descriptors. S^T = K Q^T and dP^T = V dO^T: K, V (A) and Q, dO (B) all K-major, the head
    // dim contiguous. dV += P^T dO and dK += dS^T Q: dO and Q as MN-major B (their head dim is
    // the output dimension). dQ = dS K: dS^T stored [key][query] is an MN-major A (queries
    // contiguous), K an MN-major B, and 8 columns of ones after it (a leading byte offset that
    // reaches the tile of ones).
    // Each descriptor is built once, and k-step `step` is it advanced by kmajor_step (16 columns:
    // slab step / 4, 32 bytes along the row per step inside it) or MN_STEP (16 rows further).
    static constexpr uint32_t ROW = 64 * sizeof(bf16);  // one swizzled row: 128 bytes
    static constexpr uint32_t MN_STEP = 16 * ROW;
    static __device__ __forceinline__ uint64_t kmajor(const bf16* tile) { return make_smem_descriptor(tile, 16, 8 * ROW); }
    static __device__ __forceinline__ uint64_t mnmajor(const bf16* tile, int rows) {
        return make_smem_descriptor(tile, rows * ROW, 8 * ROW);
    }
    static __device__ __forceinline__ uint32_t kmajor_step(int rows, int step) {
        return uint32_t(((step / 4) * rows * 64 + (step % 4) * 16) * sizeof(bf16));
    }
    uint64_t k_kmajor, v_kmajor;
    // Q and dO of stage 0 (a stage is Q_BYTES further), dS^T's buffer 0 (DS_BYTES further).
    uint64_t q_kmajor, do_kmajor, q_mnmajor, do_mnmajor, ds_mnmajor;
    // dQ's piece: a slab of dS^T's queries (D = 64) times all of K, or all of dS^T times a slab
    // of K's columns (D = 128), over all BLOCK_KV keys; then the ones.
    uint64_t k_piece;
    uint32_t ds_piece_bytes;

    // excerpt: turns
    // Ping-pong, as in stage 10's forward but twice per query tile: the consumers take turns at
    // issuing their wgmma (S^T and dP^T of consumer 0, then of consumer 1, then the gradients of
    // consumer 0, then of consumer 1), so that one consumer computes P^T and dS^T, or hands over
    // dQ, while the other's GEMMs run. Consumer w waits on named barrier TURN + w, which the
    // other arrives at once it has issued; consumer 0 goes first. dQ needs both halves of dS^T:
    // consumer 1 issues its piece of a tile with its gradients of that tile, after consumer 0 has
    // written its half; consumer 0 issues its piece a tile later, when consumer 1's half is
    // written (`lagging`).
    static_assert(Config::CONSUMERS == 2, "the turns alternate between two consumers");
    static constexpr int TURN = 1 + Config::CONSUMERS;  // ids 1 .. CONSUMERS are taken
    __device__ __forceinline__ void wait_turn() const { named_barrier_sync(TURN + warpgroup, 256); }
    __device__ __forceinline__ void pass_turn() const {
        named_barrier_arrive(TURN + (warpgroup + 1) % Config::CONSUMERS, 256);
    }
    bool lagging;  // consumer 0: its piece of dQ comes a tile late
    // end excerpt

    // Both consumers meet: each arrives at the other's named barrier and waits at its own. The
    // two run different code (SUMS_ROWS), and one barrier waited at from two places is one that
    // synccheck reports as divergent; this way each barrier is waited at in one place only.
    static constexpr int MEET = TURN + Config::CONSUMERS;  // ids MEET + w
    __device__ __forceinline__ void meet() const {
        named_barrier_arrive(MEET + (warpgroup + 1) % Config::CONSUMERS, 256);
        named_barrier_sync(MEET + warpgroup, 256);
    }

    // Deterministic mode only (Config::DETERMINISTIC; unset otherwise): this consumer's row of
    // K column sums, and every query row's scales into fixed point (dq_fixed_point.h).
    float* key_partial;
    const float2* row_scales;

    // Centred dQ. delta = rowsum(dO * O) comes from the bf16 O of the forward, and its rounding
    // error enters every dS_ij as -P_ij times delta_i's error, which dQ = dS K multiplies by the
    // large common part of K (the inputs' mean). In exact arithmetic rowsum(dS) = 0, so
    // dQ_i = scale (sum_j dS_ij K_j - (sum_j dS_ij) c) for any c: with c = mean_j K_j the
    // common part cancels. The blocks add their keys' column sums of K and their dS row sums
    // into the workspace; the convert kernel subtracts.
    __device__ __forceinline__ void add_key_column_sums(float* key_sum) const {
        for (int column = int(threadIdx.x) % 128; column < HEAD_DIM; column += 128) {
            float sum = 0.0f;
            for (int row = key_row; row < key_row + 64; ++row)  // this consumer's keys; past len_kv, zeros
                sum += __bfloat162float(k_tile[(column / 64) * BLOCK_KV * 64 + row * 64 +
                                               (((column % 64) / 8) ^ (row % 8)) * 8 + column % 8]);
            if constexpr (Config::DETERMINISTIC)
                key_partial[column] = sum;  // summed in block order by backward_fold_key_sums_kernel
            else {
                wait_for_prior_grid();  // key_sum is zeroed by the preprocessing
                atomicAdd(key_sum + head * HEAD_DIM + column, sum);
            }
        }
        named_barrier_sync(1 + warpgroup, 128);  // read before the epilogue overwrites these rows
    }

    // excerpt: s-dp
    // S^T = K Q^T and dP^T = V dO^T: 64 keys x BLOCK_Q queries each, two commit groups.
    __device__ __forceinline__ void issue_s_dp(float (&s)[BLOCK_Q / 2], float (&dp)[BLOCK_Q / 2], int stage) const {
        const uint32_t stage_bytes = stage * Config::Q_BYTES;  // Q and dO of the stage
        fence_registers(s);
        fence_registers(dp);
        wgmma_fence();
#pragma unroll
        for (int step = 0; step < D_STEPS; ++step)
            Wgmma<BLOCK_Q>::template ss<0, 0>(s, advance_descriptor(k_kmajor, kmajor_step(BLOCK_KV, step)),
                                              advance_descriptor(q_kmajor, stage_bytes + kmajor_step(BLOCK_Q, step)),
                                              step > 0);
        wgmma_commit();
#pragma unroll
        for (int step = 0; step < D_STEPS; ++step)
            Wgmma<BLOCK_Q>::template ss<0, 0>(dp, advance_descriptor(v_kmajor, kmajor_step(BLOCK_KV, step)),
                                              advance_descriptor(do_kmajor, stage_bytes + kmajor_step(BLOCK_Q, step)),
                                              step > 0);
        wgmma_commit();
    }
    // end excerpt

    // Whether the query tile from q_start hides any of this consumer's scores: a key or a query
    // out of range or, causal, a key after the tile's first query.
    __device__ __forceinline__ bool masks_some(int q_start) const {
        const int last_key = kv_start + key_row + 63;
        return last_key >= len_kv || q_start + BLOCK_Q > len_q || (causal && last_key > q_start);
    }

    // P^T = exp(S - LSE) = 2^(S^T scale log2 e - LSE log2 e), in place in s, and with MASKED 0
    // where the score is masked: a score is kept iff key < len_kv, query < len_q and (causal)
    // key <= query. This thread's keys are rows key0 and key0 + 8, its queries columns.
    template <bool MASKED>
    __device__ __forceinline__ void exponentiate(float (&s)[BLOCK_Q / 2], int q_start, int stage) const {
        const int key0 = kv_start + key_row + warp * 16 + fragment_row;
        const float* lse_stage = lse_rows + stage * BLOCK_Q;
#pragma unroll
        for (int n = 0; n < BLOCK_Q / 8; ++n) {
            const float2 lse_log2 = *reinterpret_cast<const float2*>(lse_stage + n * 8 + fragment_column);
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    float& value = s[4 * n + 2 * r + i];
                    value = fast_exp2(fmaf(value, scale_log2, -(i == 0 ? lse_log2.x : lse_log2.y)));
                    if constexpr (MASKED) {
                        const int key = key0 + 8 * r, query = q_start + n * 8 + fragment_column + i;
                        if (key >= len_kv || query >= len_q || (causal && key > query)) value = 0.0f;
                    }
                }
        }
    }

    // The exact delta of the tile's queries, sum over the keys of P * dP: this thread's two, the
    // warp's 16 (lanes with the same lane % 4 hold the same columns), then the consumer warps'
    // partials added by one thread per query. Returns this consumer's copy of the sums.
    __device__ __forceinline__ const float* sum_exact_delta(const float (&s)[BLOCK_Q / 2],
                                                            const float (&dp)[BLOCK_Q / 2], int read) const {
        float* partials = delta_partials + (read % 2) * 4 * Config::CONSUMERS * BLOCK_Q +
                          (warpgroup * 4 + warp) * BLOCK_Q;
#pragma unroll
        for (int n = 0; n < BLOCK_Q / 8; ++n)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                float sum = s[4 * n + i] * dp[4 * n + i] + s[4 * n + 2 + i] * dp[4 * n + 2 + i];
#pragma unroll
                for (int offset = 4; offset < 32; offset *= 2) sum += __shfl_xor_sync(FULL_MASK, sum, offset);
                if (lane < 4) partials[n * 8 + fragment_column + i] = sum;
            }
        meet();
        const float* all = delta_partials + (read % 2) * 4 * Config::CONSUMERS * BLOCK_Q;
        float* exact = reinterpret_cast<float*>(base + Shared::EXACT_DELTA) + warpgroup * BLOCK_Q;
        const int query = int(threadIdx.x) % 128;
        if (query < BLOCK_Q) {
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < 4 * Config::CONSUMERS; ++w) sum += all[w * BLOCK_Q + query];
            exact[query] = sum;
        }
        named_barrier_sync(1 + warpgroup, 128);
        return exact;
    }

    // dS^T = P^T (dP^T - delta), in place in dp; P^T and dS^T packed as bf16 A fragments (the
    // accumulators of 8-column tiles 2k and 2k+1 are the A fragment of k-step k).
    __device__ __forceinline__ void compute_ds(const float (&s)[BLOCK_Q / 2], float (&dp)[BLOCK_Q / 2],
                                               const float* delta_row, uint32_t (&p_fragment)[Q_STEPS][4],
                                               uint32_t (&ds_fragment)[Q_STEPS][4]) const {
#pragma unroll
        for (int n = 0; n < BLOCK_Q / 8; ++n) {
            const float2 delta = *reinterpret_cast<const float2*>(delta_row + n * 8 + fragment_column);
#pragma unroll
            for (int i = 0; i < 4; ++i) dp[4 * n + i] = s[4 * n + i] * (dp[4 * n + i] - (i % 2 == 0 ? delta.x : delta.y));
            p_fragment[n / 2][(n % 2) * 2 + 0] = pack_bf16x2(s[4 * n + 0], s[4 * n + 1]);
            p_fragment[n / 2][(n % 2) * 2 + 1] = pack_bf16x2(s[4 * n + 2], s[4 * n + 3]);
            ds_fragment[n / 2][(n % 2) * 2 + 0] = pack_bf16x2(dp[4 * n + 0], dp[4 * n + 1]);
            ds_fragment[n / 2][(n % 2) * 2 + 1] = pack_bf16x2(dp[4 * n + 2], dp[4 * n + 3]);
        }
    }

    // This consumer's half of dS^T to shared memory for dQ, [Q_SLABS][BLOCK_KV keys][64 queries]
    // in the 128-byte swizzle: row `key`, chunk n % 8 of 8 queries, moved by the XOR with key % 8.
    // Two buffers, tiles j and j - 1: the turns order every write after the reads of the tile two
    // before.
    __device__ __forceinline__ void store_ds(const uint32_t (&ds_fragment)[Q_STEPS][4], int read) const {
        if constexpr (HEAD_DIM == 128) {
            // One stmatrix per k-step: ds_fragment[step] is the warp's 16 keys x 16 queries as four
            // 8 x 8 matrices (queries 16 step .. + 7 of keys 0-7, of keys 8-15, then the next 8
            // queries), and lane l gives the address of row l % 8 of matrix l / 8: a 16-byte chunk.
            // Its chunk, n % 8 ^ tile_row % 8 with n = 2 step + lane / 16, is (2 step) % 8 ^ chunk.
            const int tile_row = key_row + warp * 16 + ((lane / 8) % 2) * 8 + lane % 8;
            const uint32_t row = smem_address(ds_tiles + (read % 2) * BLOCK_KV * BLOCK_Q + tile_row * 64);
            const int chunk = (lane / 16) ^ (lane % 8);
#pragma unroll
            for (int step = 0; step < Q_STEPS; ++step)
                stmatrix_x4(row + (step / 4) * BLOCK_KV * ROW + ((((2 * step) % 8) ^ chunk) * 16), ds_fragment[step]);
        } else {
            // At D = 64 one 4-byte store per register (stmatrix measured 1% slower here: lab notes 11).
            bf16* ds_tile = ds_tiles + (read % 2) * BLOCK_KV * BLOCK_Q;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int tile_row = key_row + warp * 16 + fragment_row + 8 * r;
#pragma unroll
                for (int n = 0; n < BLOCK_Q / 8; ++n)
                    *reinterpret_cast<uint32_t*>(ds_tile + (n / 8) * BLOCK_KV * 64 + tile_row * 64 +
                                                 (((n % 8) ^ (tile_row % 8)) * 8) + fragment_column) =
                        ds_fragment[n / 2][(n % 2) * 2 + r];
            }
        }
        fence_proxy_async_shared();  // the tensor cores read what ordinary stores wrote
    }

    // excerpt: gradients
    // dK += dS^T Q and dV += P^T dO (A from registers), and a piece of dQ: this tile's
    // (consumer 1) or the previous tile's (consumer 0), whose halves of dS^T are both written.
    // On its first tile consumer 0 has no piece yet: it multiplies whatever buffer 1 holds, and
    // the caller drops the result (a wgmma under a branch would make ptxas serialize them all).
    __device__ __forceinline__ void issue_gradients(float (&dk)[HEAD_DIM / 2], float (&dv)[HEAD_DIM / 2],
                                                    float (&dq)[DQ_N / 2],
                                                    const uint32_t (&p_fragment)[Q_STEPS][4],
                                                    const uint32_t (&ds_fragment)[Q_STEPS][4],
                                                    int stage, int read) const {
        const uint32_t stage_bytes = stage * Config::Q_BYTES;  // Q and dO of the stage
        fence_registers(dk);
        fence_registers(dv);
        fence_registers(dq);
        wgmma_fence();
#pragma unroll
        for (int step = 0; step < Q_STEPS; ++step)
            Wgmma<HEAD_DIM>::template rs<1>(dk, ds_fragment[step],
                                            advance_descriptor(q_mnmajor, stage_bytes + step * MN_STEP), 1);
#pragma unroll
        for (int step = 0; step < Q_STEPS; ++step)
            Wgmma<HEAD_DIM>::template rs<1>(dv, p_fragment[step],
                                            advance_descriptor(do_mnmajor, stage_bytes + step * MN_STEP), 1);
        issue_dq(dq, lagging ? read - 1 : read);
        wgmma_commit();
    }
    // end excerpt

    // Once the tile's GEMMs are done, the stage goes back to the producer: Q and dO have been read.
    __device__ __forceinline__ void release_stage(float (&dk)[HEAD_DIM / 2], float (&dv)[HEAD_DIM / 2],
                                                  float (&dq)[DQ_N / 2], int stage) const {
        wgmma_wait<0>();
        fence_registers(dk);
        fence_registers(dv);
        fence_registers(dq);
        __syncwarp();
        if (lane == 0) mbarrier_arrive(&q_empty[stage]);
    }

    // excerpt: dq-gemm
    // A consumer's 64 x 64 piece of dQ = dS K for the `read`-th query tile of the walk (A = dS^T
    // from shared memory), and (SUMS_ROWS) in the same GEMM rowsum(dS) = dS 1 over all the block's
    // keys: B is the piece's slab of K and then 8 columns of ones, so accumulator columns 64..71
    // (dq[32..35]) each hold the row sums. The caller fences and commits.
    __device__ __forceinline__ void issue_dq(float (&dq)[DQ_N / 2], int read) const {
        const uint32_t ds_bytes = (read & 1) * Config::DS_BYTES;  // read = -1: buffer 1
#pragma unroll
        for (int step = 0; step < KEY_STEPS; ++step)
            Wgmma<DQ_N>::template ss<1, 1>(dq, advance_descriptor(ds_mnmajor, ds_bytes + ds_piece_bytes + step * MN_STEP),
                                                   advance_descriptor(k_piece, step * MN_STEP), step > 0);
    }
    // end excerpt

    // Deterministic mode: the scales of this thread's two rows of its piece of query tile
    // `q_tile` (rows fragment_row and fragment_row + 8 of its warp's 16), read early enough that
    // the load is done when stage_dq needs them.
    __device__ __forceinline__ void load_row_scales(float2 (&scales)[2], int q_tile) const {
        const float2* rows = row_scales + (int64_t(head) * q_tiles + q_tile) * BLOCK_Q +
                             (warpgroup % Config::Q_SLABS) * 64 + warp * 16 + fragment_row;
        scales[0] = rows[0];
        scales[1] = rows[8];
    }

    // excerpt: stage-dq
    // This thread's part of the piece of dQ and of its dS row sums, into the staging tiles; in
    // deterministic mode as integers, each row times its scale (`scales`, from load_row_scales)
    // and rounded to the nearest.
    __device__ __forceinline__ void stage_dq(const float (&dq)[DQ_N / 2], const float2 (&scales)[2]) const {
        if constexpr (Config::DETERMINISTIC) {
#pragma unroll
            for (int i = 0; i < 8; ++i)
                reinterpret_cast<int4*>(dq_staging)[(warp * 8 + i) * 32 + lane] =
                    make_int4(__float2int_rn(dq[4 * i] * scales[0].x), __float2int_rn(dq[4 * i + 1] * scales[0].x),
                              __float2int_rn(dq[4 * i + 2] * scales[1].x), __float2int_rn(dq[4 * i + 3] * scales[1].x));
            if constexpr (SUMS_ROWS)
                if (lane % 4 == 0) {
                    int* rowsums = reinterpret_cast<int*>(rowsum_staging);
                    rowsums[warp * 16 + fragment_row] = __float2int_rn(dq[32] * scales[0].y);
                    rowsums[warp * 16 + fragment_row + 8] = __float2int_rn(dq[34] * scales[1].y);
                }
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i)
                reinterpret_cast<float4*>(dq_staging)[(warp * 8 + i) * 32 + lane] =
                    make_float4(dq[4 * i], dq[4 * i + 1], dq[4 * i + 2], dq[4 * i + 3]);
            if constexpr (SUMS_ROWS)
                if (lane % 4 == 0) {  // every column of dS 1 holds the row sums
                    rowsum_staging[warp * 16 + fragment_row] = dq[32];
                    rowsum_staging[warp * 16 + fragment_row + 8] = dq[34];
                }
        }
    }
    // end excerpt


    // excerpt: dq-reduce
    // The piece of dQ and its dS row sums to the consumer's dQ writer (write_dq), which has the
    // copy engine add them to the accumulators in device memory, in two steps. stage_piece: every
    // thread waits until the writer has read the consumer's previous piece (`handed` pieces so
    // far) and stores its part. publish_piece: the stores are made visible to the copy engine
    // and every thread arrives; the writer waits for all 128. With Config::LATE_PUBLISH the walk
    // publishes a piece in the next tile, once dP^T is done, so that the consumer does not wait
    // for its stores to land between its gradients and its next turn.
    __device__ __forceinline__ void stage_piece(const float (&dq)[DQ_N / 2], const float2 (&scales)[2],
                                                int handed) const {
        if (handed > 0) mbarrier_wait(DqWriter<Config>::free(base, warpgroup), uint32_t((handed - 1) % 2));
        stage_dq(dq, scales);
    }
    __device__ __forceinline__ void publish_piece() const {
        fence_proxy_async_shared();  // the copy engine reads what the stores wrote
        mbarrier_arrive(DqWriter<Config>::staged(base, warpgroup));
    }
    // end excerpt

    // Consumer 0's piece of the last tile, once consumer 1 has written its half (its last turn),
    // into the caller's dq.
    __device__ __forceinline__ void hand_over_last_dq(float (&dq)[DQ_N / 2], int handed) const {
        float2 scales[2];
        if constexpr (Config::DETERMINISTIC) load_row_scales(scales, q_tiles - 1);
        wait_turn();
        fence_registers(dq);
        wgmma_fence();
        issue_dq(dq, q_tiles - 1 - first_q_tile);
        wgmma_commit();
        wgmma_wait<0>();
        fence_registers(dq);
        stage_piece(dq, scales, handed);
        publish_piece();
    }

    // The epilogue: dK (times scale) and dV to bf16, into this consumer's rows of the K and V
    // tiles (the last tile's GEMMs have read them), and out by TMA, which writes only keys < len_kv.
    __device__ __forceinline__ void store_dk_dv(const float (&dk)[HEAD_DIM / 2], const float (&dv)[HEAD_DIM / 2],
                                                const CUtensorMap& dk_map, const CUtensorMap& dv_map) const {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int tile_row = key_row + warp * 16 + fragment_row + 8 * r;
#pragma unroll
            for (int d = 0; d < HEAD_DIM / 8; ++d) {
                const int offset = (d / 8) * BLOCK_KV * 64 + tile_row * 64 + ((d % 8) ^ (tile_row % 8)) * 8 + fragment_column;
                *reinterpret_cast<__nv_bfloat162*>(k_tile + offset) =
                    __floats2bfloat162_rn(dk[4 * d + 2 * r] * scale, dk[4 * d + 2 * r + 1] * scale);
                *reinterpret_cast<__nv_bfloat162*>(v_tile + offset) =
                    __floats2bfloat162_rn(dv[4 * d + 2 * r], dv[4 * d + 2 * r + 1]);
            }
        }
        fence_proxy_async_shared();
        named_barrier_sync(1 + warpgroup, 128);
        if (threadIdx.x % 128 == 0) {
            for (int slab = 0; slab < SLABS; ++slab) {
                const int offset = slab * BLOCK_KV * 64 + key_row * 64;
                tma_store_3d(&dk_map, k_tile + offset, slab * 64, kv_start + key_row, head);
                tma_store_3d(&dv_map, v_tile + offset, slab * 64, kv_start + key_row, head);
            }
            bulk_commit();
            // The block may exit once the copy engine has read its staging tiles; the writes
            // complete with the grid, before the conversion's wait_for_prior_grid returns.
            bulk_wait_read<0>();
        }
    }
};

template <class Config, bool SUMS_ROWS>
__device__ __forceinline__ ConsumerWarpgroup<Config, SUMS_ROWS> make_consumer_warpgroup(
    const BackwardBlock& block, float* dq_accumulator, float* ds_rowsum, int len_q, int len_kv, int kv_tiles,
    float scale, bool causal, DeterministicSums sums) {
    using Consumer = ConsumerWarpgroup<Config, SUMS_ROWS>;
    using Shared = BackwardSharedLayout<Config>;
    constexpr int BLOCK_Q = Config::BLOCK_Q, BLOCK_KV = Config::BLOCK_KV, SLABS = Config::SLABS;
    constexpr uint32_t ROW = Consumer::ROW;
    Consumer consumer;
    static_cast<BackwardBlock&>(consumer) = block;
    consumer.dq_accumulator = dq_accumulator;
    consumer.ds_rowsum = ds_rowsum;
    consumer.len_q = len_q;
    consumer.len_kv = len_kv;
    consumer.scale = scale;
    consumer.causal = causal;
    const int warpgroup = block.warpgroup;
    consumer.key_row = warpgroup * 64;
    consumer.ds_tiles = reinterpret_cast<bf16*>(block.base + Shared::DS_TILES);
    consumer.dq_staging = reinterpret_cast<float*>(block.base + Shared::DQ_STAGING + warpgroup * Config::DQ_BYTES);
    consumer.rowsum_staging = reinterpret_cast<float*>(block.base + Shared::ROWSUM_STAGING + warpgroup * Config::RS_BYTES);
    consumer.k_kmajor = Consumer::kmajor(block.k_tile + consumer.key_row * 64);
    consumer.v_kmajor = Consumer::kmajor(block.v_tile + consumer.key_row * 64);
    consumer.q_kmajor = Consumer::kmajor(block.q_tiles_smem);
    consumer.do_kmajor = Consumer::kmajor(block.do_tiles);
    consumer.q_mnmajor = Consumer::mnmajor(block.q_tiles_smem, BLOCK_Q);
    consumer.do_mnmajor = Consumer::mnmajor(block.do_tiles, BLOCK_Q);
    consumer.ds_mnmajor = Consumer::mnmajor(consumer.ds_tiles, BLOCK_KV);
    // The piece's slab of K, and (the leading byte offset: from one 64-column slab of B to the
    // next) the tile of ones after it.
    const size_t k_slab = Shared::K_TILE + size_t(warpgroup % SLABS) * BLOCK_KV * ROW;
    consumer.k_piece = make_smem_descriptor(block.base + k_slab, uint32_t(Shared::ONES - k_slab), 8 * ROW);
    consumer.ds_piece_bytes = (warpgroup % Config::Q_SLABS) * BLOCK_KV * ROW;
    consumer.scale_log2 = scale * LOG2E;
    consumer.exact_delta = kv_tiles == 1;
    consumer.delta_partials = reinterpret_cast<float*>(block.base + Shared::DELTA_PARTIALS);
    consumer.lagging = warpgroup == 0;
    if constexpr (Config::DETERMINISTIC) {
        const int kv_block = block.kv_start / BLOCK_KV;
        consumer.row_scales = sums.row_scales;
        consumer.key_partial =
            sums.key_partials + ((int64_t(block.head) * kv_tiles + kv_block) * Config::CONSUMERS + warpgroup) * Config::HEAD_DIM;
    }
    return consumer;
}

// A consumer warpgroup from start to end: dK and dV of its 64 keys stay in registers while it
// walks the query tiles, then leave by TMA. The register arrays are declared here, not in the
// steps that fill them: declared inside a step, they changed the compiled code (lab notes 11).
// SUMS_ROWS: whether its dQ GEMM also sums the rows of dS (Config::sums_rows).
template <class Config, bool SUMS_ROWS>
__device__ __forceinline__ void backward_consumer(const BackwardBlock& block, const CUtensorMap& dk_map,
                                                  const CUtensorMap& dv_map, float* dq_accumulator,
                                                  float* ds_rowsum, float* key_sum, int len_q, int len_kv,
                                                  int kv_tiles, float scale, bool causal,
                                                  DeterministicSums sums) {
    constexpr int HEAD_DIM = Config::HEAD_DIM, BLOCK_Q = Config::BLOCK_Q, STAGES = Config::STAGES;
    constexpr int Q_STEPS = BLOCK_Q / 16, DQ_N = ConsumerWarpgroup<Config, SUMS_ROWS>::DQ_N;
    TIMELINE_BEGIN;  // the phase stamps (common/timeline.cuh): nothing unless measured
    TIMELINE_STAMP_AS(block.warpgroup, TIMELINE_START, block.first_q_tile);
    const ConsumerWarpgroup<Config, SUMS_ROWS> consumer =
        make_consumer_warpgroup<Config, SUMS_ROWS>(block, dq_accumulator, ds_rowsum, len_q, len_kv, kv_tiles, scale, causal, sums);
    float dk[HEAD_DIM / 2] = {};
    float dv[HEAD_DIM / 2] = {};
    mbarrier_wait(block.kv_full, 0);
    consumer.add_key_column_sums(key_sum);
    if constexpr (Config::DETERMINISTIC) wait_for_prior_grid();  // the rows' scales, from the preprocessing
    // By default the dQ writer counts the warpgroup's sums in head_done (HEAD_ARRIVALS): all 128
    // threads have added theirs before the barrier that ends add_key_column_sums.
    if constexpr (!Config::DETERMINISTIC)
        if (threadIdx.x % 128 == 0) mbarrier_arrive(DqWriter<Config>::key_sums(block.base, block.warpgroup));
    // A piece without row sums hands over zeros in their place (made visible with its first piece).
    if constexpr (!SUMS_ROWS)
        if (threadIdx.x % 128 < 64) consumer.rowsum_staging[threadIdx.x % 128] = 0.0f;

    const int first_q_tile = block.first_q_tile, q_tiles = block.q_tiles;
    if (!consumer.lagging && first_q_tile < q_tiles) consumer.pass_turn();  // consumer 0 goes first
    for (int q_tile = first_q_tile, read = 0; q_tile < q_tiles; ++q_tile, ++read) {
        const int stage = read % STAGES;
        // Deterministic: the scales of the piece this tile hands over (consumer 0's is the
        // previous tile's, and it has none on its first).
        float2 scales[2];
        if constexpr (Config::DETERMINISTIC)
            if (!consumer.lagging || read > 0) consumer.load_row_scales(scales, q_tile - int(consumer.lagging));
        const int q_start = q_tile * BLOCK_Q;
        mbarrier_wait(&block.q_full[stage], (read / STAGES) % 2);
        TIMELINE_STAMP_AS(block.warpgroup, TIMELINE_TILE_READY, q_tile);
        // First turn: S^T and dP^T.
        consumer.wait_turn();
        TIMELINE_STAMP_AS(block.warpgroup, TIMELINE_TURN, q_tile);
        float s[BLOCK_Q / 2], dp[BLOCK_Q / 2];
        consumer.issue_s_dp(s, dp, stage);
        consumer.pass_turn();
        TIMELINE_STAMP_AS(block.warpgroup, TIMELINE_ISSUED, q_tile);

        // Between the turns: P^T, delta and dS^T in registers, and dS^T to shared memory for dQ.
        wgmma_wait<1>();  // S^T is done
        TIMELINE_STAMP_AS(block.warpgroup, TIMELINE_S_DONE, q_tile);
        fence_registers(s);
        // A tile that hides none of this consumer's scores takes the loop without the tests.
        if (consumer.masks_some(q_start))
            consumer.template exponentiate<true>(s, q_start, stage);
        else
            consumer.template exponentiate<false>(s, q_start, stage);
        TIMELINE_STAMP_AS(block.warpgroup, TIMELINE_P_DONE, q_tile);
        wgmma_wait<0>();  // dP^T is done
        // The previous tile's piece of dQ, staged at its end (consumer 0 has one from its second tile on).
        if (Config::LATE_PUBLISH && read > int(consumer.lagging)) consumer.publish_piece();
        TIMELINE_STAMP_AS(block.warpgroup, TIMELINE_DP_DONE, q_tile);
        fence_registers(dp);
        // delta of the tile's queries: the preprocessed rows, or (one block holds every key) the
        // exact sums of P * dP over the keys.
        const float* delta_row = block.delta_rows + stage * BLOCK_Q;
        if (consumer.exact_delta) delta_row = consumer.sum_exact_delta(s, dp, read);
        uint32_t p_fragment[Q_STEPS][4], ds_fragment[Q_STEPS][4];
        consumer.compute_ds(s, dp, delta_row, p_fragment, ds_fragment);
        consumer.store_ds(ds_fragment, read);
        TIMELINE_STAMP_AS(block.warpgroup, TIMELINE_DS_STORED, q_tile);

        // Second turn: dK, dV and a piece of dQ.
        consumer.wait_turn();
        TIMELINE_STAMP_AS(block.warpgroup, TIMELINE_GRADIENTS_TURN, q_tile);
        float dq[DQ_N / 2];
        const bool has_dq = !consumer.lagging || read > 0;
        consumer.issue_gradients(dk, dv, dq, p_fragment, ds_fragment, stage, read);
        consumer.pass_turn();
        TIMELINE_STAMP_AS(block.warpgroup, TIMELINE_GRADIENTS_ISSUED, q_tile);
        consumer.release_stage(dk, dv, dq, stage);
        TIMELINE_STAMP_AS(block.warpgroup, TIMELINE_GRADIENTS_DONE, q_tile);
        // Pieces handed over before this one: consumer 0's first piece is its second tile's.
        if (has_dq) {
            consumer.stage_piece(dq, scales, read - int(consumer.lagging));
            if (!Config::LATE_PUBLISH) consumer.publish_piece();
        }
        // Consumer 0's piece is the previous tile's; the stamp says the loop's tile.
        TIMELINE_STAMP_AS(block.warpgroup, TIMELINE_DQ_HANDED, q_tile);
    }
    // The last piece staged in the walk (consumer 0's, from its second tile on).
    if (Config::LATE_PUBLISH && q_tiles - first_q_tile > int(consumer.lagging)) consumer.publish_piece();
    // Consumer 0's piece of the last tile, once consumer 1 has written its half (its last turn).
    if (consumer.lagging && first_q_tile < q_tiles) {
        float dq[DQ_N / 2];
        consumer.hand_over_last_dq(dq, q_tiles - first_q_tile - 1);
    }
    // Every dQ has read all of K before a consumer overwrites its rows with dK.
    consumer.meet();
    consumer.store_dk_dv(dk, dv, dk_map, dv_map);
    TIMELINE_STAMP_AS(block.warpgroup, TIMELINE_END, q_tiles);
}

// Consumer `consumer`'s dQ writer, one thread of the producer warpgroup (DqWriter). For each
// tile of the block's walk, in the order the consumer hands its pieces over (consumer 0 each a
// step late, in the same order), it waits until the consumer has staged the piece, lets the copy
// engine add it (in deterministic mode as integers), and frees the staging tiles once the copy
// has read them. By default, where head_done is not null, it then waits until its last add has
// completed and its consumer's K column sums are added, and counts itself in head_done.
template <class Config>
__device__ __forceinline__ void write_dq(const BackwardBlock& block, int consumer, float* dq_accumulator,
                                         float* ds_rowsum, uint32_t* head_done) {
    using Shared = BackwardSharedLayout<Config>;
    const uint32_t dq_staging = smem_address(block.base + Shared::DQ_STAGING + consumer * Config::DQ_BYTES);
    const uint32_t rowsum_staging = smem_address(block.base + Shared::ROWSUM_STAGING + consumer * Config::RS_BYTES);
    wait_for_prior_grid();  // the accumulators are zeroed by the preprocessing
    const int steps = block.q_tiles - block.first_q_tile;
    for (int step = 0; step < steps; ++step) {
        const int q_tile = block.first_q_tile + step;
        mbarrier_wait(DqWriter<Config>::staged(block.base, consumer), uint32_t(step % 2));
        const int64_t tile = int64_t(block.head) * block.q_tiles + q_tile;
        float* dq_tile = dq_accumulator + tile * Config::BLOCK_Q * Config::HEAD_DIM + consumer * 64 * 64;
        float* rowsum_tile = ds_rowsum + tile * Config::BLOCK_Q;
        if constexpr (Config::DETERMINISTIC) {
            bulk_reduce_add_s32(reinterpret_cast<int32_t*>(dq_tile), dq_staging, Config::DQ_BYTES);
            bulk_reduce_add_s32(reinterpret_cast<int32_t*>(rowsum_tile), rowsum_staging, Config::RS_BYTES);
        } else {
            bulk_reduce_add_f32(dq_tile, dq_staging, Config::DQ_BYTES);
            bulk_reduce_add_f32(rowsum_tile, rowsum_staging, Config::RS_BYTES);
        }
        bulk_commit();
        bulk_wait_read<0>();
        mbarrier_arrive(DqWriter<Config>::free(block.base, consumer));
    }
    // excerpt: head-done
    if constexpr (!Config::DETERMINISTIC)
        if (head_done != nullptr) {  // the conversion may read the sums once the head's writers all count
            mbarrier_wait(DqWriter<Config>::key_sums(block.base, consumer), 0);  // the consumer's K sums are in
            bulk_wait<0>();              // the last reduce-adds have written device memory, not only read
            fence_proxy_async_global();  // the copy engine's writes before this thread's release
            red_release_gpu_add(head_done + block.head, 1);
        }
    // end excerpt
}

// One block: BLOCK_KV keys of one (batch, head); blockIdx.x = head * kv_tiles + key tile.
template <class Config>
__global__ void __launch_bounds__(Config::THREADS, 1)
flash_backward_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                      const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap do_map,
                      const __grid_constant__ CUtensorMap lse_map, const __grid_constant__ CUtensorMap delta_map,
                      const __grid_constant__ CUtensorMap dk_map, const __grid_constant__ CUtensorMap dv_map,
                      float* __restrict__ dq_accumulator, float* __restrict__ ds_rowsum,
                      float* __restrict__ key_sum, uint32_t* __restrict__ head_done, int len_q, int len_kv,
                      int kv_tiles, int q_tiles, float scale, bool causal, const DeterministicSums sums) {
    constexpr int STAGES = Config::STAGES, CONSUMER_WARPS = 4 * Config::CONSUMERS;
    __shared__ uint64_t kv_full;          // K and V have landed
    __shared__ uint64_t q_full[STAGES];   // the stage's Q, dO, LSE and delta have landed
    __shared__ uint64_t q_empty[STAGES];  // every consumer warp is done with the stage
    extern __shared__ unsigned char dynamic_shared[];
    // excerpt: shared-base
    // The tiles start on a 1024-byte boundary (the swizzle atom). Rounding up by pointer
    // arithmetic on the shared array, not through an integer, lets the compiler see that every
    // pointer below is into shared memory: LDS and STS, not generic loads and stores.
    unsigned char* base = dynamic_shared + (1024 - smem_address(dynamic_shared) % 1024) % 1024;
    // end excerpt
    // Started while the preprocessing still runs. Each role waits for it where it first needs what
    // it wrote, so that the barriers, K and V and their column sums are under way before it ends:
    // the producer before the first delta and LSE (and only then lets the conversion of dQ be
    // launched, whose counters the preprocessing zeroes), the consumers before their K sums'
    // atomics (deterministic: before the rows' scales), the dQ writers before their first
    // reduce-add.
    const BackwardBlock block = make_backward_block<Config>(base, &kv_full, q_full, q_empty, kv_tiles, q_tiles,
                                                            causal, int(blockIdx.x));

    if (threadIdx.x == 0) {
        mbarrier_init(&kv_full, 1);
        for (int stage = 0; stage < STAGES; ++stage) {
            mbarrier_init(&q_full[stage], 1);
            mbarrier_init(&q_empty[stage], CONSUMER_WARPS);
        }
        for (int consumer = 0; consumer < Config::CONSUMERS; ++consumer) {
            mbarrier_init(DqWriter<Config>::staged(base, consumer), 128);
            mbarrier_init(DqWriter<Config>::free(base, consumer), 1);
            mbarrier_init(DqWriter<Config>::key_sums(base, consumer), 1);
        }
        fence_barrier_init();
    }
    const __nv_bfloat162 ones = __float2bfloat162_rn(1.0f);
    for (int i = int(threadIdx.x); i < int(Config::ONES_BYTES / 4); i += Config::THREADS)
        reinterpret_cast<__nv_bfloat162*>(block.ones)[i] = ones;
    fence_proxy_async_shared();  // the tensor cores read what ordinary stores wrote
    __syncthreads();

    if (block.warpgroup < 0) {
        setmaxnreg_dec<Config::PRODUCER_REGISTERS>();
        if (threadIdx.x == 0) backward_producer<Config>(block, q_map, k_map, v_map, do_map, lse_map, delta_map);
        // Lane 0 of warps 1 and 2: consumer 0's and 1's dQ writer.
        const int consumer = int(threadIdx.x) / 32 - 1;
        if (threadIdx.x % 32 == 0 && consumer >= 0 && consumer < Config::CONSUMERS) {
            const int piece_rows = (consumer % Config::Q_SLABS) * 64;  // the piece's rows of each query tile
            write_dq<Config>(block, consumer, dq_accumulator, ds_rowsum + piece_rows, head_done);
        }
        return;
    }
    setmaxnreg_inc<Config::CONSUMER_REGISTERS>();
    // Each consumer's own walk (SUMS_ROWS). Where every consumer sums rows (D = 64) the first test
    // is true at compile time and the kernel has one walk.
    if (Config::Q_SLABS == Config::CONSUMERS || Config::sums_rows(block.warpgroup))
        backward_consumer<Config, true>(block, dk_map, dv_map, dq_accumulator, ds_rowsum, key_sum, len_q, len_kv,
                                        kv_tiles, scale, causal, sums);
    else
        backward_consumer<Config, false>(block, dk_map, dv_map, dq_accumulator, ds_rowsum, key_sum, len_q, len_kv,
                                         kv_tiles, scale, causal, sums);
}

// A [count] FP32 vector read in boxes of box_count, seen as a [1][count] tensor (the encoder
// wants a second dimension; its stride only has to be a legal one).
CUtensorMap make_row_map(const float* vector, int64_t count, int box_count) {
    CUtensorMap map{};
    const cuuint64_t dims[2] = {cuuint64_t(count), 1};
    const cuuint64_t strides[1] = {(cuuint64_t(count) * sizeof(float) + 15) / 16 * 16};
    const cuuint32_t box[2] = {cuuint32_t(box_count), 1};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult result = tensor_map_encoder()(
        &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<float*>(vector), dims, strides, box,
        element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
        CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (result != CUDA_SUCCESS)
        throw std::runtime_error("attention_backward: cuTensorMapEncodeTiled (rows) failed with CUresult " +
                                 std::to_string(int(result)));
    return map;
}

// The workspace, in FP32: per query row (padded to whole tiles) delta and LSE log2 e, then
// what is summed by atomics and so starts at zero (the preprocessing zeroes it): the dS row sums, the K column sums per head,
// the conversion's counters (head_done) and the dQ accumulator (64-row blocks of every
// query tile). Deterministic mode adds, before
// the zeroed part, the K column sums per block and consumer, the bounds on K and V per head and
// chunk of keys, and each query row's two scales (DeterministicSums); its dS row sums and dQ
// accumulator hold integers in the same places.
struct BackwardWorkspace {
    size_t delta_offset = 0, lse_offset = 0, key_partials_offset = 0, kv_bounds_offset = 0,
           row_scales_offset = 0, rowsum_offset = 0, key_sum_offset = 0, head_done_offset = 0, dq_offset = 0,
           total = 0;
    explicit BackwardWorkspace(const AttentionShape& shape) {
        const size_t heads = size_t(shape.batch) * size_t(shape.heads);
        const size_t block_q = shape.head_dim == 64 ? BackwardTiling<64>::BLOCK_Q : BackwardTiling<128>::BLOCK_Q;
        static_assert(BackwardTiling<64>::BLOCK_KV == BackwardTiling<128>::BLOCK_KV, "one key tile");
        constexpr size_t block_kv = BackwardTiling<64>::BLOCK_KV, consumers = BackwardTiling<64>::CONSUMERS;
        const size_t q_tiles = (size_t(shape.len_q) + block_q - 1) / block_q;
        const size_t kv_tiles = (size_t(shape.len_kv) + block_kv - 1) / block_kv;
        const size_t padded_rows = heads * q_tiles * block_q;
        const bool deterministic = shape.deterministic;
        auto bytes = [](size_t floats) { return (floats * sizeof(float) + 255) / 256 * 256; };
        lse_offset = delta_offset + bytes(padded_rows);
        key_partials_offset = lse_offset + bytes(padded_rows);
        kv_bounds_offset = key_partials_offset +
                           (deterministic ? bytes(heads * kv_tiles * consumers * size_t(shape.head_dim)) : 0);
        row_scales_offset = kv_bounds_offset + (deterministic ? bytes(2 * heads * KV_BOUND_CHUNKS) : 0);
        rowsum_offset = row_scales_offset + (deterministic ? bytes(2 * padded_rows) : 0);
        key_sum_offset = rowsum_offset + bytes(padded_rows);
        head_done_offset = key_sum_offset + bytes(heads * size_t(shape.head_dim));
        dq_offset = head_done_offset + bytes(heads);
        total = dq_offset + bytes(padded_rows * size_t(shape.head_dim));
    }
};

// A launch that may begin while the kernel before it in the stream still runs (programmatic
// dependent launch): the kernel waits for that one with wait_for_prior_grid.
struct ProgrammaticLaunch {
    cudaLaunchAttribute attribute{};
    cudaLaunchConfig_t config{};
    ProgrammaticLaunch(unsigned blocks, unsigned threads, size_t shared_bytes, cudaStream_t stream) {
        attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute.val.programmaticStreamSerializationAllowed = 1;
        config.gridDim = dim3(blocks);
        config.blockDim = dim3(threads);
        config.dynamicSmemBytes = shared_bytes;
        config.stream = stream;
        config.attrs = &attribute;
        config.numAttrs = 1;
    }
    ProgrammaticLaunch(const ProgrammaticLaunch&) = delete;  // config points at attribute
};

template <int HEAD_DIM, bool DETERMINISTIC>
void launch_backward(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const float* lse,
                     const bf16* dout, bf16* dq, bf16* dk, bf16* dv, const AttentionShape& shape,
                     cudaStream_t stream, const float* key_centre) {
    using Config = std::conditional_t<DETERMINISTIC, DeterministicBackwardTiling<HEAD_DIM>, BackwardTiling<HEAD_DIM>>;
    using Shared = BackwardSharedLayout<Config>;
    const int batch_heads = shape.batch * shape.heads;
    const int kv_tiles = ceil_div(shape.len_kv, Config::BLOCK_KV);
    const int q_tiles = ceil_div(shape.len_q, Config::BLOCK_Q);
    // Everything that can be refused is refused before anything is allocated or launched.
    if (int64_t(batch_heads) * kv_tiles > INT_MAX)
        throw std::invalid_argument("attention_backward: batch * heads * ceil(len_kv / " +
                                    std::to_string(Config::BLOCK_KV) + ") = " +
                                    std::to_string(int64_t(batch_heads) * kv_tiles) +
                                    " is not allowed: must be at most 2^31 - 1");
    if (int64_t(batch_heads) * q_tiles * Config::BLOCK_Q > INT_MAX)
        throw std::invalid_argument("attention_backward: batch * heads * len_q = " +
                                    std::to_string(shape.lse_elements()) +
                                    " is not allowed: must be below 2^31 - 64 (TMA coordinates)");
    const BackwardWorkspace layout(shape);
    Workspace workspace(layout.total, stream);
    char* scratch = workspace.as<char>();
    float* delta = reinterpret_cast<float*>(scratch + layout.delta_offset);
    float* lse_log2 = reinterpret_cast<float*>(scratch + layout.lse_offset);
    float* ds_rowsum = reinterpret_cast<float*>(scratch + layout.rowsum_offset);
    float* key_sum = reinterpret_cast<float*>(scratch + layout.key_sum_offset);
    float* dq_accumulator = reinterpret_cast<float*>(scratch + layout.dq_offset);
    // The conversion beside the main kernel's last rounds, where there are enough of them.
    int device = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const bool progressive =
        !DETERMINISTIC && int64_t(batch_heads) * kv_tiles > int64_t(PROGRESSIVE_MIN_ROUNDS - 1) * sms;
    uint32_t* head_done = progressive ? reinterpret_cast<uint32_t*>(scratch + layout.head_done_offset) : nullptr;
    const int64_t padded_rows = int64_t(batch_heads) * q_tiles * Config::BLOCK_Q;
    DeterministicSums sums{};  // all null in the default mode
    const float2* kv_bounds = nullptr;
    if (DETERMINISTIC) {
        sums.key_partials = reinterpret_cast<float*>(scratch + layout.key_partials_offset);
        sums.row_scales = reinterpret_cast<const float2*>(scratch + layout.row_scales_offset);
        kv_bounds = reinterpret_cast<const float2*>(scratch + layout.kv_bounds_offset);
        // Kmax and Vmax of each head, in KV_BOUND_CHUNKS parts, for the preprocessing's scales.
        const int64_t items = int64_t(batch_heads) * KV_BOUND_CHUNKS;
        backward_kv_bounds_kernel<HEAD_DIM><<<unsigned(std::min<int64_t>(items, 65536)), PREPROCESS_THREADS, 0, stream>>>(
            k, v, shape.len_kv, items, const_cast<float2*>(kv_bounds));
        CUDA_CHECK_LAUNCH();
    }

    constexpr int PREPROCESS_ROWS = PREPROCESS_THREADS / (HEAD_DIM / 8);  // rows per block and pass
    const int preprocess_blocks =
        int(std::min<int64_t>((padded_rows + PREPROCESS_ROWS - 1) / PREPROCESS_ROWS, 65536));
    // The zeroed part starts and ends on 256-byte boundaries (BackwardWorkspace's bytes()), so
    // it is whole float4s. By default the call's first kernel, an ordinary launch (it reads what
    // the kernels before it wrote); deterministic, it may start while the bounds are found, and
    // waits for them before it reads anything.
    ProgrammaticLaunch preprocess_launch(unsigned(preprocess_blocks), PREPROCESS_THREADS, 0, stream);
    if (!DETERMINISTIC) preprocess_launch.config.numAttrs = 0;
    CUDA_CHECK(cudaLaunchKernelEx(&preprocess_launch.config, backward_preprocess_kernel<HEAD_DIM, DETERMINISTIC>,
                                  o, dout, lse, delta, lse_log2, shape.len_q, q_tiles * Config::BLOCK_Q, padded_rows,
                                  reinterpret_cast<float4*>(ds_rowsum), int64_t(layout.total - layout.rowsum_offset) / 16,
                                  kv_bounds, const_cast<float2*>(sums.row_scales)));

    const CUtensorMap q_map = make_tensor_map(q, batch_heads, shape.len_q, HEAD_DIM, Config::BLOCK_Q);
    const CUtensorMap do_map = make_tensor_map(dout, batch_heads, shape.len_q, HEAD_DIM, Config::BLOCK_Q);
    const CUtensorMap k_map = make_tensor_map(k, batch_heads, shape.len_kv, HEAD_DIM, Config::BLOCK_KV);
    const CUtensorMap v_map = make_tensor_map(v, batch_heads, shape.len_kv, HEAD_DIM, Config::BLOCK_KV);
    const CUtensorMap dk_map = make_tensor_map(dk, batch_heads, shape.len_kv, HEAD_DIM, 64);
    const CUtensorMap dv_map = make_tensor_map(dv, batch_heads, shape.len_kv, HEAD_DIM, 64);
    const CUtensorMap lse_map = make_row_map(lse_log2, padded_rows, Config::BLOCK_Q);
    const CUtensorMap delta_map = make_row_map(delta, padded_rows, Config::BLOCK_Q);
    auto kernel = flash_backward_kernel<Config>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(Shared::BYTES)));
    const ProgrammaticLaunch main_launch(unsigned(batch_heads * kv_tiles), Config::THREADS, Shared::BYTES, stream);
    CUDA_CHECK(cudaLaunchKernelEx(&main_launch.config, kernel, q_map, k_map, v_map, do_map, lse_map, delta_map, dk_map, dv_map,
                                  dq_accumulator, ds_rowsum, key_sum, head_done, shape.len_q, shape.len_kv, kv_tiles,
                                  q_tiles, shape.softmax_scale(), shape.causal, sums));

    if (DETERMINISTIC) {
        const int64_t items = int64_t(batch_heads) * HEAD_DIM;  // a warp each
        const int fold_blocks = int(std::min<int64_t>((items + FOLD_THREADS / 32 - 1) / (FOLD_THREADS / 32), 65536));
        backward_fold_key_sums_kernel<HEAD_DIM><<<fold_blocks, FOLD_THREADS, 0, stream>>>(
            key_sum, sums.key_partials, batch_heads, kv_tiles * Config::CONSUMERS);
        CUDA_CHECK_LAUNCH();
    }

    // The convert kernel's c is key_sum * (1 / len_kv), the mean of this call's keys; a caller's
    // key_centre takes its place as it is (times 1, exact), so both run the one kernel. The sums
    // of the call's keys are still made, and no longer read.
    const int64_t float4s = padded_rows * HEAD_DIM / 4;
    const int convert_blocks = int(std::min<int64_t>(float4s / CONVERT_THREADS, 65536));
    const ProgrammaticLaunch convert_launch(unsigned(convert_blocks), CONVERT_THREADS, 0, stream);
    auto convert = progressive ? backward_convert_dq_kernel<HEAD_DIM, DETERMINISTIC, !DETERMINISTIC>
                               : backward_convert_dq_kernel<HEAD_DIM, DETERMINISTIC, false>;
    CUDA_CHECK(cudaLaunchKernelEx(&convert_launch.config, convert,
                                  static_cast<const float*>(dq_accumulator), static_cast<const float*>(ds_rowsum),
                                  static_cast<const float*>(key_centre ? key_centre : key_sum), dq, float4s,
                                  shape.len_q, q_tiles * Config::Q_SLABS,
                                  key_centre ? 1.0f : 1.0f / float(shape.len_kv), shape.softmax_scale(),
                                  sums.row_scales, static_cast<const uint32_t*>(head_done),
                                  kv_tiles * HEAD_ARRIVALS<Config>));
}

}  // namespace

const StageCapabilities& stage_capabilities() {
    // 16-byte alignment: TMA needs the tensors' base addresses on 16-byte boundaries.
    // Compute capability 9.0: wgmma and TMA exist on Hopper only.
    // Deterministic backward: dQ and the dS row sums added as integers, the K column sums in a fixed order.
    // Key centre: the convert kernel reads a caller's c in place of the mean of the call's keys.
    static const StageCapabilities caps{"11_hopper_backward", "bf16", {64, 128}, MAX_LENGTH,
                                        MAX_LENGTH, true, /*backward=*/true, 16, 90,
                                        /*deterministic_backward=*/true,
                                        /*key_centre_backward=*/true};
    return caps;
}

size_t attention_workspace_bytes(const AttentionShape&) { return 0; }

void attention_forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                       const AttentionShape& shape, cudaStream_t stream) {
    validate_forward(shape, stage_capabilities(), q, k, v, o, lse);
    if (shape.head_dim == 64)
        launch<Tiling64>(q, k, v, o, lse, shape, stream);
    else if (shape.causal)
        launch<Tiling128Causal>(q, k, v, o, lse, shape, stream);
    else
        launch<Tiling128>(q, k, v, o, lse, shape, stream);
}

size_t attention_backward_workspace_bytes(const AttentionShape& shape) {
    return BackwardWorkspace(shape).total;
}

void attention_backward(const bf16* q, const bf16* k, const bf16* v, const bf16* o,
                        const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv,
                        const AttentionShape& shape, cudaStream_t stream, const float* key_centre) {
    validate_backward(shape, stage_capabilities(), q, k, v, o, lse, dout, dq, dk, dv, key_centre);
    if (shape.head_dim == 64 && shape.deterministic)
        launch_backward<64, true>(q, k, v, o, lse, dout, dq, dk, dv, shape, stream, key_centre);
    else if (shape.head_dim == 64)
        launch_backward<64, false>(q, k, v, o, lse, dout, dq, dk, dv, shape, stream, key_centre);
    else if (shape.deterministic)
        launch_backward<128, true>(q, k, v, o, lse, dout, dq, dk, dv, shape, stream, key_centre);
    else
        launch_backward<128, false>(q, k, v, o, lse, dout, dq, dk, dv, shape, stream, key_centre);
}
