// Stage 10: the softmax hidden under the tensor cores. In stage 09 each consumer warpgroup
// alternates between waiting for its wgmma and computing exponentials, and the tensor cores idle
// whenever both warpgroups compute at once. Two schedules fix that. Between warpgroups
// (ping-pong): named barriers make the consumers take turns at issuing their GEMMs, so one
// warpgroup's softmax runs while the other's GEMMs occupy the tensor cores. Inside a warpgroup:
// S_{j+1} = Q K_{j+1}^T and O += P_j V_j are issued together, and the source puts the softmax of
// S_{j+1} before the wait for P_j V_j (ptxas moves that wait up today: chapter 10, Limits). The
// producer, the ring and the epilogue are stage 09's.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include "attention.h"
#include "cuda_check.h"
#include "hopper.cuh"
#include "ptx.cuh"
#include "timeline.cuh"
#include "validate.h"

namespace {

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
    // excerpt: softmax-both-arms
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
    // end excerpt
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
    // excerpt: turns
    // Ping-pong: the consumer warpgroups take turns at issuing their wgmma, so that while one
    // warpgroup's GEMMs run on the tensor cores the others compute their softmax. Warpgroup w
    // waits on named barrier TURN + w, which the warpgroup before it (w - 1, cyclically) arrives
    // at once it has issued. 256 threads: the 128 that wait and the 128 that arrive.
    constexpr int TURN = 1 + Config::CONSUMERS;  // ids 1 .. CONSUMERS are the epilogue's
    auto wait_turn = [&] { named_barrier_sync(TURN + warpgroup, 256); };
    auto pass_turn = [&] { named_barrier_arrive(TURN + (warpgroup + 1) % Config::CONSUMERS, 256); };
    // end excerpt
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

    // excerpt: overlap-loop
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
    // end excerpt

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

}  // namespace

const StageCapabilities& stage_capabilities() {
    // 16-byte alignment: TMA needs the tensors' base addresses on 16-byte boundaries.
    // Compute capability 9.0: wgmma and TMA exist on Hopper only.
    static const StageCapabilities caps{"10_pingpong", "bf16", {64, 128}, MAX_LENGTH,
                                        MAX_LENGTH, true, false, 16, 90};
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
