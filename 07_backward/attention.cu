// Stage 07: the backward pass, added to stage 06's forward. The forward is 06's kernel as it
// stands (it already writes LSE, which is all the backward needs from it). The backward is:
//   1. preprocess: D = rowsum(dO * O) per query row in FP32, a zeroed dQ accumulator, and the
//      column sums of K (for the centred dQ, see convert_dq_kernel);
//   2. one pass over KV tiles (DqStrategy::atomic, the default): one block per 128 keys walks
//      every query tile, recomputes P from Q, K and LSE, forms dS, keeps dK and dV in
//      registers and adds its share of dQ = dS K to an FP32 workspace (on Hopper through the
//      copy engine's bulk reduction, cp.reduce.async.bulk; before it with atomics) ...
//   3. ... which a last kernel centres, scales and rounds to bf16.
// DqStrategy::second_kernel replaces 2 and 3 by a dK/dV kernel and a dQ kernel with the
// opposite loop order, which recomputes S and dP: slower, but deterministic.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "attention.h"
#include "cuda_check.h"
#include "ptx.cuh"
#include "swizzle.h"
#include "validate.h"
#include "workspace.h"

#ifndef SWIZZLE
#define SWIZZLE 1
#endif

// The two ways of computing dQ; the chapter measures both. attention_backward uses
// kDefaultDqStrategy; attention_backward_with lets a timing program pick.
enum class DqStrategy { atomic, second_kernel };
void attention_backward_with(DqStrategy strategy, const __nv_bfloat16* q, const __nv_bfloat16* k,
                             const __nv_bfloat16* v, const __nv_bfloat16* o, const float* lse,
                             const __nv_bfloat16* dout, __nv_bfloat16* dq, __nv_bfloat16* dk,
                             __nv_bfloat16* dv, const AttentionShape& shape, cudaStream_t stream);

namespace {

using bf16 = __nv_bfloat16;

// One kernel configuration. Each warp owns ROW_TILES mma tiles of 16 query rows: two tiles
// reuse every K and V fragment it loads twice, halving shared-memory reads per mma.
// V_BUFFERS = 1: K double-buffered, V_j fetched while S_j is computed; two barriers per tile.
// V_BUFFERS = 2: K and V both double-buffered, K_{j+1} and V_{j+1} fetched during all of tile
// j; one barrier per tile, for one more V tile of shared memory.
// SKIP_UNCHANGED_RESCALE: skip O's rescale, for the whole warp, on the tiles that leave every
// row max of the warp unchanged. It saves multiplies but the branch splits the loop body, so
// the compiler cannot interleave one row tile's softmax with the other's P V mma. At D = 64
// the multiplies are few and the tiling without the branch is faster; at D = 128 the
// interleaved body needs more registers than there are, and spills (tune.cu times both).
template <int HEAD_DIM_, int WARPS_, int ROW_TILES_, int BLOCK_KV_, int MIN_BLOCKS_, int V_BUFFERS_ = 1,
          bool SKIP_UNCHANGED_RESCALE_ = true>
struct Tiling {
    static constexpr int HEAD_DIM = HEAD_DIM_;
    static constexpr int WARPS = WARPS_;
    static constexpr int THREADS = WARPS * 32;
    static constexpr int ROW_TILES = ROW_TILES_;
    static constexpr int ROWS_PER_WARP = 16 * ROW_TILES;
    static constexpr int BLOCK_Q = WARPS * ROWS_PER_WARP;  // Br
    static constexpr int BLOCK_KV = BLOCK_KV_;             // Bc
    static constexpr int MIN_BLOCKS = MIN_BLOCKS_;         // for __launch_bounds__
    static constexpr int V_BUFFERS = V_BUFFERS_;
    static constexpr bool SKIP_UNCHANGED_RESCALE = SKIP_UNCHANGED_RESCALE_;
    // Q fragments stay in registers when they are few; else they are re-read with ldmatrix.
    static constexpr bool Q_IN_REGISTERS = ROW_TILES * HEAD_DIM <= 128;
    static constexpr size_t SHARED_BYTES =
        size_t(BLOCK_Q + (2 + V_BUFFERS) * BLOCK_KV) * HEAD_DIM * sizeof(__nv_bfloat16);
};

// The tilings the launcher uses (tune.cu measures these and others). Build with
// NVCC_EXTRA=-DPIPELINE_V_BUFFERS=1 to run the whole stage with a single V buffer.
#ifndef PIPELINE_V_BUFFERS
#define PIPELINE_V_BUFFERS 2
#endif
using Tiling64 = Tiling<64, 4, 2, 64, 2, PIPELINE_V_BUFFERS, false>;
using Tiling128 = Tiling<128, 4, 2, 64, 1, PIPELINE_V_BUFFERS>;

// The backward grids put the tile index in gridDim.y (at most 65535): 2^20 keeps it there.
constexpr int MAX_LENGTH = 1 << 20;
constexpr float LOG2E = 1.4426950408889634f;
constexpr unsigned FULL_MASK = 0xffffffffu;

template <int HEAD_DIM>
using Tile = TileLayout<HEAD_DIM, SWIZZLE != 0>;

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Rows first_row .. first_row + ROWS - 1 of a [len, HEAD_DIM] matrix into a (swizzled) tile,
// 16 bytes per cp.async. Each thread copies one 16-byte column of rows row, row + PASS, ...;
// PASS is a multiple of 8, so all its copies share one swizzle and differ by constants. Rows at
// or past len (only in a last, partial tile) are zero-filled and never read from memory.
template <int ROWS, int HEAD_DIM, int THREAD_COUNT>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* matrix, int first_row, int len) {
    constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;
    constexpr int PASS = THREAD_COUNT / CHUNKS_PER_ROW;  // rows copied by the block per pass
    static_assert(THREAD_COUNT % CHUNKS_PER_ROW == 0 && PASS % 8 == 0 && ROWS % PASS == 0,
                  "every thread copies the same column of whole 8-row groups");
    const int row = int(threadIdx.x) / CHUNKS_PER_ROW;
    const int column = int(threadIdx.x) % CHUNKS_PER_ROW * 8;
    const bf16* source = matrix + int64_t(first_row + row) * HEAD_DIM + column;
    const uint32_t target = smem_address(tile + Tile<HEAD_DIM>::offset(row, column));
    constexpr uint32_t PASS_BYTES = PASS * HEAD_DIM * sizeof(bf16);
    if (first_row + ROWS <= len) {
#pragma unroll
        for (int i = 0; i < ROWS / PASS; ++i)
            cp_async_16(target + i * PASS_BYTES, source + i * PASS * HEAD_DIM);
    } else {
#pragma unroll
        for (int i = 0; i < ROWS / PASS; ++i) {
            const bool valid = first_row + row + i * PASS < len;
            cp_async_16_zfill(target + i * PASS_BYTES, valid ? source + i * PASS * HEAD_DIM : matrix,
                              valid);
        }
    }
}

// One block: BLOCK_Q query rows of one (batch, head). The heads are taken group_heads at a
// time: the blocks of one group come before the next group's, so the blocks in flight share
// the K and V of a few heads, which stay in L2 (heads_per_l2_group). Inside a group the q tile
// is the slow index, counted from the last, so causal's longest tiles start first.
template <class Config>
__global__ void __launch_bounds__(Config::THREADS, Config::MIN_BLOCKS)
flash_forward_pipelined_kernel(const bf16* __restrict__ Q, const bf16* __restrict__ K,
                         const bf16* __restrict__ V, bf16* __restrict__ O,
                         float* __restrict__ lse, int batch_heads, int group_heads, int len_q,
                         int len_kv, int q_tiles, float scale, bool causal) {
    constexpr int HEAD_DIM = Config::HEAD_DIM, THREADS = Config::THREADS;
    constexpr int ROW_TILES = Config::ROW_TILES, ROWS_PER_WARP = Config::ROWS_PER_WARP;
    constexpr int BLOCK_Q = Config::BLOCK_Q, BLOCK_KV = Config::BLOCK_KV;
    constexpr int QK_STEPS = HEAD_DIM / 16;  // k-steps of S = Q K^T (over the head dim)
    constexpr int PV_STEPS = BLOCK_KV / 16;  // k-steps of O = P V (over the keys)
    constexpr int S_TILES = BLOCK_KV / 8;    // 8-column tiles of S per warp
    constexpr int O_TILES = HEAD_DIM / 8;    // 8-column tiles of O per warp

    extern __shared__ __align__(128) unsigned char shared_memory[];
    bf16* q_tile = reinterpret_cast<bf16*>(shared_memory);  // [BLOCK_Q][HEAD_DIM]
    bf16* k_tiles = q_tile + BLOCK_Q * HEAD_DIM;              // [2][BLOCK_KV][HEAD_DIM]
    bf16* v_tiles = k_tiles + 2 * BLOCK_KV * HEAD_DIM;        // [V_BUFFERS][BLOCK_KV][HEAD_DIM]
    constexpr uint32_t K_TILE_BYTES = BLOCK_KV * HEAD_DIM * sizeof(bf16);

    const int group_blocks = group_heads * q_tiles;
    const int group = int(blockIdx.x) / group_blocks;
    const int first_head = group * group_heads;
    const int heads_in_group = min(group_heads, batch_heads - first_head);
    const int rank = int(blockIdx.x) - group * group_blocks;
    const int q_block = q_tiles - 1 - rank / heads_in_group;
    const int64_t head = first_head + rank % heads_in_group;
    const int q0 = q_block * BLOCK_Q;
    const int warp = int(threadIdx.x) / 32;
    const int lane = int(threadIdx.x) % 32;
    // In every mma fragment, lane holds rows lane/4 and lane/4 + 8, columns 2(lane%4), +1.
    const int fragment_row = lane / 4;
    const int fragment_column = 2 * (lane % 4);
    const int warp_row = warp * ROWS_PER_WARP;  // first row of this warp inside the tile

    const bf16* q_head = Q + head * len_q * HEAD_DIM;
    const bf16* k_head = K + head * len_kv * HEAD_DIM;
    const bf16* v_head = V + head * len_kv * HEAD_DIM;

    // Causal: keys past the tile's last row are masked for every row of it, skip their tiles.
    int kv_tiles = ceil_div(len_kv, BLOCK_KV);
    if (causal) kv_tiles = min(kv_tiles, ceil_div(q0 + BLOCK_Q, BLOCK_KV));

    // Prologue: Q and the first K tile (and V tile, with two V buffers), one group.
    load_tile<BLOCK_Q, HEAD_DIM, THREADS>(q_tile, q_head, q0, len_q);
    load_tile<BLOCK_KV, HEAD_DIM, THREADS>(k_tiles, k_head, 0, len_kv);
    if constexpr (Config::V_BUFFERS == 2) load_tile<BLOCK_KV, HEAD_DIM, THREADS>(v_tiles, v_head, 0, len_kv);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    // The warp's slice of Q as mma A fragments. ldmatrix.x4: lanes 0-15 point at rows 0-15 of
    // the left 8 columns, 16-31 the right ones. Kept in registers when they are few; else
    // q_base addresses them in shared memory, where Q stays for the whole loop.
    uint32_t q_base[4];
#pragma unroll
    for (int c = 0; c < 4; ++c)
        q_base[c] = smem_address(q_tile + Tile<HEAD_DIM>::offset(warp_row + lane % 16,
                                                                 c * 16 + (lane / 16) * 8));
    constexpr int Q_REGISTER_STEPS = Config::Q_IN_REGISTERS ? QK_STEPS : 1;
    uint32_t q_fragment[ROW_TILES][Q_REGISTER_STEPS][4];
    if constexpr (Config::Q_IN_REGISTERS) {
#pragma unroll
        for (int m = 0; m < ROW_TILES; ++m)
#pragma unroll
            for (int step = 0; step < QK_STEPS; ++step)
                ldmatrix_x4(q_fragment[m][step],
                            q_base[step % 4] + 2 * (m * 16 * HEAD_DIM + step / 4 * 64));
    }

    // Per-lane ldmatrix addresses, swizzle included, computed once. Moving 8 rows down or 64
    // columns right moves every element of the tile by the same amount (the XOR depends on
    // row % 8 and touches only the low 3 bits of the chunk), so each access below is one of
    // these bases plus a constant. K, ldmatrix.x4: lanes 0-7 give keys 0-7 at dims 0-7 of the
    // step, lanes 8-15 the same keys at dims 8-15, lanes 16-31 keys 8-15 likewise: the B
    // operands of two 8-key tiles. V, ldmatrix.x4.trans: lanes 0-15 give keys 0-15 at dims
    // 0-7 of a 16-dim pair, lanes 16-31 at dims 8-15: the B operands of two 8-dim tiles.
    // k_base (and v_base, with two V buffers) addresses the buffer of the current tile and
    // flips between the two each iteration.
    uint32_t k_base[4], v_base[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        k_base[c] = smem_address(k_tiles + Tile<HEAD_DIM>::offset(lane % 8 + (lane / 16) * 8,
                                                                  c * 16 + (lane / 8) % 2 * 8));
        v_base[c] = smem_address(v_tiles + Tile<HEAD_DIM>::offset(lane % 16, c * 16 + (lane / 16) * 8));
    }

    float o_accumulator[ROW_TILES][O_TILES][4] = {};
    // Two rows per lane and row tile: [m][0] is fragment_row, [m][1] is fragment_row + 8.
    // row_max is the running max of the raw scores; row_sum is this lane's share of l (its
    // columns only), summed over the quad once at the end.
    float row_max[ROW_TILES][2], row_sum[ROW_TILES][2];
#pragma unroll
    for (int m = 0; m < ROW_TILES; ++m)
        for (int r = 0; r < 2; ++r) {
            row_max[m][r] = -INFINITY;
            row_sum[m][r] = 0.0f;
        }
    const float scale_log2 = scale * LOG2E;  // exp(scale * x) = 2^(x * scale * log2 e)

    // excerpt: pipeline
    for (int kv_tile = 0; kv_tile < kv_tiles; ++kv_tile) {
        const int kv0 = kv_tile * BLOCK_KV;
        // K_j (and V_j, with two V buffers) has landed: it is the only group in flight. The
        // barrier also tells that every warp is done with tile j-1, so its buffers may be
        // refilled.
        cp_async_wait<0>();
        __syncthreads();
        bf16* next_k = k_tiles + ((kv_tile + 1) % 2) * BLOCK_KV * HEAD_DIM;
        if constexpr (Config::V_BUFFERS == 1) {
            load_tile<BLOCK_KV, HEAD_DIM, THREADS>(v_tiles, v_head, kv0, len_kv);
            cp_async_commit();
            if (kv_tile + 1 < kv_tiles)
                load_tile<BLOCK_KV, HEAD_DIM, THREADS>(next_k, k_head, kv0 + BLOCK_KV, len_kv);
            cp_async_commit();  // possibly empty: keeps "V_j is the older of two groups" true
        } else {
            if (kv_tile + 1 < kv_tiles) {
                load_tile<BLOCK_KV, HEAD_DIM, THREADS>(next_k, k_head, kv0 + BLOCK_KV, len_kv);
                load_tile<BLOCK_KV, HEAD_DIM, THREADS>(
                    v_tiles + ((kv_tile + 1) % 2) * BLOCK_KV * HEAD_DIM, v_head, kv0 + BLOCK_KV, len_kv);
            }
            cp_async_commit();
        }
    // end excerpt

#pragma unroll
        for (int c = 0; c < 4; ++c) {
            refresh_register(k_base[c]);
            refresh_register(v_base[c]);
        }

        // excerpt: two-row-tiles
        // S = Q K^T. K is stored [key][dim]: read as rows it is the column-major B operand
        // (dim x key) that mma wants, so no transpose.
        float s[ROW_TILES][S_TILES][4] = {};
#pragma unroll
        for (int step = 0; step < QK_STEPS; ++step) {
            uint32_t a[ROW_TILES][4];
#pragma unroll
            for (int m = 0; m < ROW_TILES; ++m) {
                if constexpr (Config::Q_IN_REGISTERS) {
#pragma unroll
                    for (int i = 0; i < 4; ++i) a[m][i] = q_fragment[m][step][i];
                } else {
                    ldmatrix_x4(a[m], q_base[step % 4] + 2 * (m * 16 * HEAD_DIM + step / 4 * 64));
                }
            }
#pragma unroll
            for (int n = 0; n < S_TILES; n += 2) {
                uint32_t b[4];
                ldmatrix_x4(b, k_base[step % 4] + 2 * (n * 8 * HEAD_DIM + step / 4 * 64));
#pragma unroll
                for (int m = 0; m < ROW_TILES; ++m) {
                    mma_m16n8k16_bf16(s[m][n], a[m], b[0], b[1]);
                    mma_m16n8k16_bf16(s[m][n + 1], a[m], b[2], b[3]);
                }
            }
        }
        // end excerpt

        // Mask only where a tile can hold a masked score: past len_kv, or above the diagonal.
        const bool needs_mask =
            kv0 + BLOCK_KV > len_kv || (causal && kv0 + BLOCK_KV - 1 > q0 + warp_row);
        if (needs_mask) {
#pragma unroll
            for (int m = 0; m < ROW_TILES; ++m)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    // Column c of this lane's scores (key kv0 + c + fragment_column) is
                    // visible iff c < visible: one compare against a constant per score.
                    const int row = q0 + warp_row + m * 16 + fragment_row + r * 8;
                    const int visible = (causal ? min(len_kv, row + 1) : len_kv) - kv0 - fragment_column;
#pragma unroll
                    for (int n = 0; n < S_TILES; ++n)
#pragma unroll
                        for (int i = 0; i < 2; ++i)
                            if (n * 8 + i >= visible) s[m][n][2 * r + i] = -INFINITY;
                }
        }

        uint32_t p_fragment[ROW_TILES][PV_STEPS][4];
#pragma unroll
        for (int m = 0; m < ROW_TILES; ++m) {
            // Online softmax in FP32. A row is spread over the 4 lanes of a quad: reduce
            // its max with two butterfly shuffles (lane ^ 1, lane ^ 2).
            float new_max[2] = {row_max[m][0], row_max[m][1]};
#pragma unroll
            for (int n = 0; n < S_TILES; ++n) {
                new_max[0] = fmaxf(new_max[0], fmaxf(s[m][n][0], s[m][n][1]));
                new_max[1] = fmaxf(new_max[1], fmaxf(s[m][n][2], s[m][n][3]));
            }
            float rescale[2], max_offset[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                new_max[r] = fmaxf(new_max[r], __shfl_xor_sync(FULL_MASK, new_max[r], 1));
                new_max[r] = fmaxf(new_max[r], __shfl_xor_sync(FULL_MASK, new_max[r], 2));
                // A row with no visible key yet keeps max -inf: use 0, so no inf - inf.
                max_offset[r] = new_max[r] == -INFINITY ? 0.0f : new_max[r] * scale_log2;
                rescale[r] = fast_exp2(row_max[m][r] * scale_log2 - max_offset[r]);
                row_max[m][r] = new_max[r];
                row_sum[m][r] *= rescale[r];
            }

            // P = exp(scale * (S - m)), rounded to bf16 and packed as the A operand of
            // O += P V: the accumulators of two neighbouring 8-key tiles are exactly the A
            // fragment of one 16-key k-step (tile 2k: registers 0, 1; 2k+1: 2, 3).
#pragma unroll
            for (int n = 0; n < S_TILES; ++n) {
                const float p0 = fast_exp2(fmaf(s[m][n][0], scale_log2, -max_offset[0]));
                const float p1 = fast_exp2(fmaf(s[m][n][1], scale_log2, -max_offset[0]));
                const float p2 = fast_exp2(fmaf(s[m][n][2], scale_log2, -max_offset[1]));
                const float p3 = fast_exp2(fmaf(s[m][n][3], scale_log2, -max_offset[1]));
                row_sum[m][0] += p0 + p1;
                row_sum[m][1] += p2 + p3;
                p_fragment[m][n / 2][(n % 2) * 2 + 0] = pack_bf16x2(p0, p1);
                p_fragment[m][n / 2][(n % 2) * 2 + 1] = pack_bf16x2(p2, p3);
            }

            // Once the running max has settled most tiles leave it unchanged (rescale = 1
            // exactly): the multiplies may be skipped when that holds for every row of the warp.
            if (!Config::SKIP_UNCHANGED_RESCALE ||
                __any_sync(FULL_MASK, rescale[0] != 1.0f || rescale[1] != 1.0f)) {
#pragma unroll
                for (int d = 0; d < O_TILES; ++d) {
                    o_accumulator[m][d][0] *= rescale[0];
                    o_accumulator[m][d][1] *= rescale[0];
                    o_accumulator[m][d][2] *= rescale[1];
                    o_accumulator[m][d][3] *= rescale[1];
                }
            }
        }

        if constexpr (Config::V_BUFFERS == 1) {
            // V_j has landed (K_{j+1}, the newer group, may still be in flight); the barrier
            // makes every thread's part of it visible.
            cp_async_wait<1>();
            __syncthreads();
        }

        // O += P V. V is stored [key][dim], but the B operand must hold two consecutive keys
        // of one dim per register: ldmatrix.trans transposes each 8x8 block on the way.
#pragma unroll
        for (int step = 0; step < PV_STEPS; ++step) {
#pragma unroll
            for (int d = 0; d < O_TILES; d += 2) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, v_base[(d / 2) % 4] + 2 * (step * 16 * HEAD_DIM + d / 8 * 64));
#pragma unroll
                for (int m = 0; m < ROW_TILES; ++m) {
                    mma_m16n8k16_bf16(o_accumulator[m][d], p_fragment[m][step], b[0], b[1]);
                    mma_m16n8k16_bf16(o_accumulator[m][d + 1], p_fragment[m][step], b[2], b[3]);
                }
            }
        }
        // excerpt: buffer-flip
        const uint32_t k_flip = kv_tile % 2 == 0 ? K_TILE_BYTES : 0u - K_TILE_BYTES;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            k_base[c] += k_flip;
            if constexpr (Config::V_BUFFERS == 2) v_base[c] += k_flip;  // V tiles: same size
        }
    }
        // end excerpt

    // Finish l over the quad, normalize, store the rows that exist. LSE = m * scale + ln(l).
#pragma unroll
    for (int m = 0; m < ROW_TILES; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float sum = row_sum[m][r];
            sum += __shfl_xor_sync(FULL_MASK, sum, 1);
            sum += __shfl_xor_sync(FULL_MASK, sum, 2);
            const int row = q0 + warp_row + m * 16 + fragment_row + r * 8;
            if (row >= len_q) continue;
            const float inverse_sum = 1.0f / sum;
            bf16* o_row = O + (head * len_q + row) * HEAD_DIM;
#pragma unroll
            for (int d = 0; d < O_TILES; ++d)
                *reinterpret_cast<__nv_bfloat162*>(o_row + d * 8 + fragment_column) =
                    __floats2bfloat162_rn(o_accumulator[m][d][2 * r] * inverse_sum,
                                          o_accumulator[m][d][2 * r + 1] * inverse_sum);
            if (lse != nullptr && lane % 4 == 0)
                lse[head * len_q + row] = row_max[m][r] * scale + logf(sum);
        }
}

// Heads per group of the grid. When the K and V of all heads fit in L2 together, one group,
// so the whole grid runs heaviest tile first (with few waves, a heavy causal tile started
// late is a long tail); otherwise as many heads as fill half of L2.
inline int heads_per_l2_group(const AttentionShape& shape) {
    int device = 0, l2_bytes = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
    const int64_t heads = int64_t(shape.batch) * shape.heads;
    const int64_t kv_bytes = 2 * int64_t(shape.len_kv) * shape.head_dim * int64_t(sizeof(bf16));
    if (heads * kv_bytes <= l2_bytes) return int(heads);
    return int(std::clamp<int64_t>(l2_bytes / 2 / kv_bytes, 1, heads));
}

// group_heads = 0: heads_per_l2_group; tune.cu also times 1 and batch * heads.
template <class Config>
void launch(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
            const AttentionShape& shape, cudaStream_t stream, int group_heads = 0) {
    const int batch_heads = shape.batch * shape.heads;
    const int q_tiles = ceil_div(shape.len_q, Config::BLOCK_Q);
    const int64_t blocks = int64_t(q_tiles) * batch_heads;
    if (blocks > INT_MAX)
        throw std::invalid_argument("attention: batch * heads * ceil(len_q / " +
                                    std::to_string(Config::BLOCK_Q) + ") = " +
                                    std::to_string(blocks) +
                                    " is not allowed: must be at most 2^31 - 1");
    const size_t shared_bytes = Config::SHARED_BYTES;
    auto kernel = flash_forward_pipelined_kernel<Config>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(shared_bytes)));
    kernel<<<unsigned(blocks), Config::THREADS, shared_bytes, stream>>>(
        q, k, v, o, lse, batch_heads,
        group_heads > 0 ? std::min(group_heads, batch_heads) : heads_per_l2_group(shape),
        shape.len_q, shape.len_kv, q_tiles, shape.softmax_scale(), shape.causal);
    CUDA_CHECK_LAUNCH();
}

// ==== the backward pass ===================================================================

// The measurement in the chapter picked the one-pass kernel with atomics: faster at the target
// shapes, though slower at some causal ones, and not deterministic (the second kernel is, and
// stays selectable).
constexpr DqStrategy kDefaultDqStrategy = DqStrategy::atomic;

// ---- fragments ----------------------------------------------------------------------------
// Lane l of a warp; g = l / 4 is the fragment row, t = l % 4 the column pair (ptx.cuh).

// A (16 x 16) from a row-major tile: rows row0.., columns col0..
template <class Layout>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* tile, int row0, int col0,
                                       int lane) {
    ldmatrix_x4(a, smem_address(tile + Layout::offset(row0 + lane % 16, col0 + (lane / 16) * 8)));
}
// A (16 x 16) whose transpose is stored: the tile holds A^T row-major (rows are A's k).
template <class Layout>
__device__ __forceinline__ void load_a_transposed(uint32_t (&a)[4], const bf16* tile, int m0,
                                                  int k0, int lane) {
    ldmatrix_x4_trans(a, smem_address(tile + Layout::offset(k0 + lane % 8 + (lane / 16) * 8,
                                                            m0 + ((lane / 8) % 2) * 8)));
}
// B for two n-tiles (n0.., n0 + 8..) over k0..k0+15, from a tile that stores B^T row-major
// ([n][k], as K is stored for S = Q K^T). b[0], b[1]: n-tile n0; b[2], b[3]: n-tile n0 + 8.
template <class Layout>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], const bf16* tile, int n0, int k0,
                                       int lane) {
    ldmatrix_x4(b, smem_address(tile + Layout::offset(n0 + lane % 8 + (lane / 16) * 8,
                                                      k0 + ((lane / 8) % 2) * 8)));
}
// The same two n-tiles from a tile that stores B row-major ([k][n], as V is for O = P V).
template <class Layout>
__device__ __forceinline__ void load_b_transposed(uint32_t (&b)[4], const bf16* tile, int n0,
                                                  int k0, int lane) {
    ldmatrix_x4_trans(b, smem_address(tile + Layout::offset(k0 + lane % 8 + ((lane / 8) % 2) * 8,
                                                            n0 + (lane / 16) * 8)));
}
// Two neighbouring 16x8 FP32 accumulators are, rounded to bf16, the A fragment of the
// 16x16 block they cover: the accumulator layout of mma is its A layout (FlashAttention-2).
__device__ __forceinline__ void accumulators_to_a(uint32_t (&a)[4], const float (&left)[4],
                                                  const float (&right)[4]) {
    a[0] = pack_bf16x2(left[0], left[1]);
    a[1] = pack_bf16x2(left[2], left[3]);
    a[2] = pack_bf16x2(right[0], right[1]);
    a[3] = pack_bf16x2(right[2], right[3]);
}

// Sum over the 8 fragment rows g of a warp (lanes 4 apart): the column sums end in lanes 0-3.
__device__ __forceinline__ float column_sum(float value) {
    value += __shfl_xor_sync(0xffffffffu, value, 4);
    value += __shfl_xor_sync(0xffffffffu, value, 8);
    value += __shfl_xor_sync(0xffffffffu, value, 16);
    return value;
}

// The two products that both backward kernels start from, for one warp's 16 rows over the
// whole head dim: s += A B^T and dp += A' B'^T, the A fragments loaded once per k-step and
// used for a whole row of n-tiles. The dK/dV kernel passes A = K, A' = V, B = Q, B' = dO (S^T
// and dP^T); the dQ kernel A = Q, A' = dO, B = K, B' = V (S and dP). The A fragments come from
// a_registers and a2_registers when A_IN_REGISTERS (D = 64), else from rows a_row0.. of the
// tiles a_tile and a2_tile.
template <class Layout, bool A_IN_REGISTERS, int S_TILES, int REGISTER_STEPS>
__device__ __forceinline__ void scores_and_gradients(
    float (&s)[S_TILES][4], float (&dp)[S_TILES][4],
    const uint32_t (&a_registers)[REGISTER_STEPS][4],
    const uint32_t (&a2_registers)[REGISTER_STEPS][4], const bf16* a_tile, const bf16* a2_tile,
    int a_row0, const bf16* b_tile, const bf16* b2_tile, int lane) {
    constexpr int K_STEPS = Layout::CHUNKS_PER_ROW * Layout::CHUNK_ELEMENTS / 16;  // head dim / 16
    static_assert(!A_IN_REGISTERS || REGISTER_STEPS == K_STEPS, "one register fragment per k-step");
#pragma unroll
    for (int ks = 0; ks < K_STEPS; ++ks) {
        uint32_t a[4], a2[4];
        if constexpr (A_IN_REGISTERS) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                a[i] = a_registers[ks][i];
                a2[i] = a2_registers[ks][i];
            }
        } else {
            load_a<Layout>(a, a_tile, a_row0, ks * 16, lane);
            load_a<Layout>(a2, a2_tile, a_row0, ks * 16, lane);
        }
#pragma unroll
        for (int np = 0; np < S_TILES / 2; ++np) {
            uint32_t b[4];
            load_b<Layout>(b, b_tile, np * 16, ks * 16, lane);
            mma_m16n8k16_bf16(s[2 * np], a, b[0], b[1]);
            mma_m16n8k16_bf16(s[2 * np + 1], a, b[2], b[3]);
            load_b<Layout>(b, b2_tile, np * 16, ks * 16, lane);
            mma_m16n8k16_bf16(dp[2 * np], a2, b[0], b[1]);
            mma_m16n8k16_bf16(dp[2 * np + 1], a2, b[2], b[3]);
        }
    }
}

__device__ __forceinline__ void store_bf16x2(bf16* destination, float low, float high) {
    *reinterpret_cast<__nv_bfloat162*>(destination) = __floats2bfloat162_rn(low, high);
}

// ---- backward 1: D = rowsum(dO * O) ---------------------------------------------------------
constexpr int PRE_THREADS = 256;

template <int HEAD_DIM>
__global__ void __launch_bounds__(PRE_THREADS)
preprocess_kernel(const bf16* __restrict__ O, const bf16* __restrict__ dO,
                  float* __restrict__ delta, int64_t rows) {
    const int lane = threadIdx.x % 32;
    const int64_t warps = int64_t(gridDim.x) * (PRE_THREADS / 32);
    for (int64_t row = int64_t(blockIdx.x) * (PRE_THREADS / 32) + threadIdx.x / 32; row < rows;
         row += warps) {
        const bf16* o_row = O + row * HEAD_DIM;
        const bf16* do_row = dO + row * HEAD_DIM;
        float sum = 0.0f;
#pragma unroll
        for (int d = lane * 2; d < HEAD_DIM; d += 64) {
            const float2 o = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(o_row + d));
            const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(do_row + d));
            sum += o.x * g.x + o.y * g.y;
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        if (lane == 0) delta[row] = sum;
    }
}

// ---- second-kernel strategy, 2a: dK and dV ------------------------------------------------
// One block of BWD_WARPS warps owns BWD_BLOCK_KV = 16 x BWD_WARPS keys, 16 per warp, and walks
// the query tiles.
// Per query tile each warp computes, for its 16 keys (transposed, so keys are the rows that
// dK and dV accumulate over):
//   S^T = K Q^T,  P^T = exp2(S^T scale log2e - LSE log2e),  dP^T = V dO^T,
//   dS^T = P^T (dP^T - D),  dV += P^T dO,  dK += dS^T Q,
// with P^T and dS^T going from accumulators straight into A fragments, never through shared
// memory. dQ is left to the dQ kernel (2b).
// 4 warps (64 keys) per block, two blocks per SM; -DATTENTION_BWD_WARPS=8 builds the variant
// with 128 keys and one block per SM that the chapter measures against it.
#ifndef ATTENTION_BWD_WARPS
#define ATTENTION_BWD_WARPS 4
#endif
constexpr int BWD_WARPS = ATTENTION_BWD_WARPS;
constexpr int BWD_BLOCK_KV = 16 * BWD_WARPS;
constexpr int BWD_THREADS = BWD_WARPS * 32;
constexpr int BWD_BLOCKS_PER_SM = BWD_WARPS == 4 ? 2 : 1;
// -DATTENTION_FUSE_DQ=0 launches the second strategy's two kernels one after the other.
#ifndef ATTENTION_FUSE_DQ
#define ATTENTION_FUSE_DQ 1
#endif
// (Only with 4-warp dK/dV blocks: the fused kernel has one block size, the dQ kernel's.)
constexpr bool kFuseSecondKernel = ATTENTION_FUSE_DQ != 0 && ATTENTION_BWD_WARPS == 4;

template <int HEAD_DIM>
struct BackwardTiles {
    // Query tiles are narrower for D = 128 so that dK and dV (64 + 64 FP32 per lane) leave
    // room for S^T and dP^T without spilling.
    static constexpr int BLOCK_Q = HEAD_DIM == 128 ? 32 : 64;
    static constexpr int KV_TILE = BWD_BLOCK_KV * HEAD_DIM;
    static constexpr int Q_TILE = BLOCK_Q * HEAD_DIM;
    static constexpr size_t shared_bytes() {
        return sizeof(bf16) * (2 * size_t(KV_TILE) + 4 * size_t(Q_TILE)) +
               sizeof(float) * (4 + BWD_WARPS) * BLOCK_Q;
    }
};

// The body of one dK/dV block: KV tile kv_block of head `head`, kv_blocks such tiles per head.
template <int HEAD_DIM>
__device__ __forceinline__ void
dkdv_block(const bf16* __restrict__ Q, const bf16* __restrict__ K, const bf16* __restrict__ V,
            const bf16* __restrict__ dO, const float* __restrict__ lse,
            float* __restrict__ delta, bf16* __restrict__ dK, bf16* __restrict__ dV, int len_q,
            int len_kv, float scale, bool causal, int64_t head, int kv_block, int kv_blocks) {
    using Tiles = BackwardTiles<HEAD_DIM>;
    using Layout = Tile<HEAD_DIM>;
    constexpr int BLOCK_Q = Tiles::BLOCK_Q;
    constexpr int K_STEPS = HEAD_DIM / 16;   // k-steps over the head dim (S^T, dP^T)
    constexpr int Q_STEPS = BLOCK_Q / 16;    // k-steps over the queries (dV, dK)
    constexpr int S_TILES = BLOCK_Q / 8;     // n-tiles of S^T and dP^T
    constexpr int D_TILES = HEAD_DIM / 8;    // n-tiles of dK and dV
    const float scale_log2 = scale * LOG2E;

    extern __shared__ __align__(128) unsigned char shared_raw[];
    bf16* k_tile = reinterpret_cast<bf16*>(shared_raw);
    bf16* v_tile = k_tile + Tiles::KV_TILE;
    bf16* q_tiles = v_tile + Tiles::KV_TILE;      // two buffers
    bf16* do_tiles = q_tiles + 2 * Tiles::Q_TILE;  // two buffers
    float* lse_log2 = reinterpret_cast<float*>(do_tiles + 2 * Tiles::Q_TILE);
    float* delta_tiles = lse_log2 + 2 * BLOCK_Q;
    float* warp_sums = delta_tiles + 2 * BLOCK_Q;  // [BWD_WARPS][BLOCK_Q]

    const int k0 = kv_block * BWD_BLOCK_KV;
    const bf16* q_head = Q + head * len_q * HEAD_DIM;
    const bf16* do_head = dO + head * len_q * HEAD_DIM;
    const float* lse_head = lse + head * len_q;
    float* delta_head = delta + head * len_q;
    // When one block holds every key of the head, it sees whole rows of P and dP and can form
    // D = rowsum(P * dP) exactly, instead of from the bf16-rounded O (see the chapter).
    const bool exact_delta = kv_blocks == 1;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int key_local = warp * 16 + g;  // this lane's keys: key_local and key_local + 8

    float dk_acc[D_TILES][4] = {};
    float dv_acc[D_TILES][4] = {};
    constexpr bool KV_IN_REGISTERS = HEAD_DIM == 64;
    uint32_t k_registers[KV_IN_REGISTERS ? K_STEPS : 1][4];
    uint32_t v_registers[KV_IN_REGISTERS ? K_STEPS : 1][4];

    // Causal: queries before k0 see none of these keys; skip their tiles.
    const int q_tiles_total = (len_q + BLOCK_Q - 1) / BLOCK_Q;
    const int first_tile = causal ? k0 / BLOCK_Q : 0;

    // LSE (in the exp2 domain) and D of one query tile; rows past the end get LSE = +inf,
    // so that their P is exactly 0 and they add nothing to dK or dV.
    auto load_row_stats = [&](int tile, int buffer) {
        for (int i = threadIdx.x; i < BLOCK_Q; i += BWD_THREADS) {
            const int row = tile * BLOCK_Q + i;
            lse_log2[buffer * BLOCK_Q + i] = row < len_q ? lse_head[row] * LOG2E : INFINITY;
            delta_tiles[buffer * BLOCK_Q + i] = row < len_q ? delta_head[row] : 0.0f;
        }
    };

    if (first_tile < q_tiles_total) {
        load_tile<BWD_BLOCK_KV, HEAD_DIM, BWD_THREADS>(k_tile, K + head * len_kv * HEAD_DIM, k0, len_kv);
        load_tile<BWD_BLOCK_KV, HEAD_DIM, BWD_THREADS>(v_tile, V + head * len_kv * HEAD_DIM, k0, len_kv);
        load_tile<BLOCK_Q, HEAD_DIM, BWD_THREADS>(q_tiles, q_head, first_tile * BLOCK_Q, len_q);
        load_tile<BLOCK_Q, HEAD_DIM, BWD_THREADS>(do_tiles, do_head, first_tile * BLOCK_Q, len_q);
        cp_async_commit();
        load_row_stats(first_tile, 0);
    }

    for (int tile = first_tile; tile < q_tiles_total; ++tile) {
        const int buffer = (tile - first_tile) % 2;
        if (tile + 1 < q_tiles_total) {
            const int next = 1 - buffer;
            load_tile<BLOCK_Q, HEAD_DIM, BWD_THREADS>(q_tiles + next * Tiles::Q_TILE, q_head,
                                                      (tile + 1) * BLOCK_Q, len_q);
            load_tile<BLOCK_Q, HEAD_DIM, BWD_THREADS>(do_tiles + next * Tiles::Q_TILE, do_head,
                                                      (tile + 1) * BLOCK_Q, len_q);
            cp_async_commit();
            load_row_stats(tile + 1, next);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* q_tile = q_tiles + buffer * Tiles::Q_TILE;
        const bf16* do_tile = do_tiles + buffer * Tiles::Q_TILE;
        const float* tile_lse = lse_log2 + buffer * BLOCK_Q;
        const float* tile_delta = delta_tiles + buffer * BLOCK_Q;
        const int q0 = tile * BLOCK_Q;
        // At D = 64 the warp's K and V fragments (2 x 16 registers) stay in registers for the
        // whole walk instead of being re-read from shared memory for every query tile.
        if constexpr (KV_IN_REGISTERS) {
            if (tile == first_tile) {
#pragma unroll
                for (int ks = 0; ks < K_STEPS; ++ks) {
                    load_a<Layout>(k_registers[ks], k_tile, warp * 16, ks * 16, lane);
                    load_a<Layout>(v_registers[ks], v_tile, warp * 16, ks * 16, lane);
                }
            }
        }

        // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys.
        float s[S_TILES][4] = {};
        float dp[S_TILES][4] = {};
        scores_and_gradients<Layout, KV_IN_REGISTERS>(s, dp, k_registers, v_registers, k_tile,
                                                      v_tile, warp * 16, q_tile, do_tile, lane);

        // P^T from the saved LSE (no max, no sum: the forward already found them).
#pragma unroll
        for (int nt = 0; nt < S_TILES; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = k0 + key_local + (e / 2) * 8;
                const int query_local = nt * 8 + 2 * t + e % 2;
                const bool masked = key >= len_kv || (causal && key > q0 + query_local);
                s[nt][e] = masked ? 0.0f : fast_exp2(s[nt][e] * scale_log2 - tile_lse[query_local]);
            }
        if (exact_delta) {
            // Column sums of P^T dP^T over the block's keys replace D in shared memory (and in
            // the workspace, for the second dQ kernel). A uniform branch.
#pragma unroll
            for (int nt = 0; nt < S_TILES; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const float sum = column_sum(s[nt][c] * dp[nt][c] + s[nt][c + 2] * dp[nt][c + 2]);
                    if (g == 0) warp_sums[warp * BLOCK_Q + nt * 8 + 2 * t + c] = sum;
                }
            __syncthreads();
            for (int i = threadIdx.x; i < BLOCK_Q; i += BWD_THREADS) {
                float sum = 0.0f;
#pragma unroll
                for (int w = 0; w < BWD_WARPS; ++w) sum += warp_sums[w * BLOCK_Q + i];
                delta_tiles[buffer * BLOCK_Q + i] = sum;
                if (q0 + i < len_q) delta_head[q0 + i] = sum;
            }
            __syncthreads();
        }
        // dS^T = P^T (dP^T - D). The scale of dS is applied once, to dK and dQ at the end.
#pragma unroll
        for (int nt = 0; nt < S_TILES; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                dp[nt][e] = s[nt][e] * (dp[nt][e] - tile_delta[nt * 8 + 2 * t + e % 2]);

        // dV += P^T dO and dK += dS^T Q: both A operands are already in registers.
#pragma unroll
        for (int kq = 0; kq < Q_STEPS; ++kq) {
            uint32_t p_fragment[4], ds_fragment[4];
            accumulators_to_a(p_fragment, s[2 * kq], s[2 * kq + 1]);
            accumulators_to_a(ds_fragment, dp[2 * kq], dp[2 * kq + 1]);
#pragma unroll
            for (int dp_tile = 0; dp_tile < D_TILES / 2; ++dp_tile) {
                uint32_t b[4];
                load_b_transposed<Layout>(b, do_tile, dp_tile * 16, kq * 16, lane);
                mma_m16n8k16_bf16(dv_acc[2 * dp_tile], p_fragment, b[0], b[1]);
                mma_m16n8k16_bf16(dv_acc[2 * dp_tile + 1], p_fragment, b[2], b[3]);
                load_b_transposed<Layout>(b, q_tile, dp_tile * 16, kq * 16, lane);
                mma_m16n8k16_bf16(dk_acc[2 * dp_tile], ds_fragment, b[0], b[1]);
                mma_m16n8k16_bf16(dk_acc[2 * dp_tile + 1], ds_fragment, b[2], b[3]);
            }
        }

        __syncthreads();  // the next copies overwrite the buffers read above
    }

    // Keys past the end are not stored; keys no query sees (causal) get exact zeros.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = k0 + key_local + r * 8;
        if (key >= len_kv) continue;
        bf16* dk_row = dK + (head * len_kv + key) * HEAD_DIM;
        bf16* dv_row = dV + (head * len_kv + key) * HEAD_DIM;
#pragma unroll
        for (int dt = 0; dt < D_TILES; ++dt) {
            store_bf16x2(dk_row + dt * 8 + 2 * t, dk_acc[dt][2 * r] * scale,
                         dk_acc[dt][2 * r + 1] * scale);
            store_bf16x2(dv_row + dt * 8 + 2 * t, dv_acc[dt][2 * r], dv_acc[dt][2 * r + 1]);
        }
    }
}

template <int HEAD_DIM>
__global__ void __launch_bounds__(BWD_THREADS, BWD_BLOCKS_PER_SM)
dkdv_kernel(const bf16* __restrict__ Q, const bf16* __restrict__ K, const bf16* __restrict__ V,
            const bf16* __restrict__ dO, const float* __restrict__ lse,
            float* __restrict__ delta, bf16* __restrict__ dK, bf16* __restrict__ dV, int len_q,
            int len_kv, float scale, bool causal) {
    dkdv_block<HEAD_DIM>(Q, K, V, dO, lse, delta, dK, dV, len_q, len_kv, scale, causal,
                         blockIdx.x, blockIdx.y, gridDim.y);
}

// ---- backward 2, atomic strategy: dK, dV and dQ in one pass (FlashAttention-2's split) -----
// One block of 8 warps owns 128 keys and walks the query tiles, 64 rows at a time at D = 128
// (128 at D = 64). The five products of a tile are each split across the 8 warps in the shape
// that reads little shared memory per mma, and that shape differs from product to product
// (D = 128 below):
//   S = Q K^T and dP = dO V^T (64 x 128): 2 x 4 warps, each 32 queries x 32 keys;
//   P and dS = P (dP - D) go to shared memory, rounded to bf16;
//   dV += P^T dO and dK += dS^T Q (128 x D): 4 x 2 warps, each 32 keys x D/2 dims, held in
//   registers for the whole walk;
//   dQ = dS K (64 x D): 2 x 4 warps, each 32 queries x D/4 dims, added to an FP32 accumulator
//   in global memory (convert_dq_kernel rounds it at the end): on Hopper each warp stages its
//   share in shared memory and hands it to the copy engine (cp.reduce.async.bulk), which adds
//   it while the warp goes on; before Hopper, with atomics.
// Q and dO are loaded two tiles ahead on Hopper (three stages), one tile ahead before it.
// Per warp and tile that is 0.45 ldmatrix.x4 per mma, against 0.63 for the 16-keys-per-warp
// kernel above, and five products instead of the second-kernel strategy's seven.
// BLOCK_KV keys per block, BLOCK_Q queries per step, WARPS warps. S and dP have BLOCK_Q / 32
// warps along the queries (32 each) and the rest along the keys; dK and dV BLOCK_KV / 32 along
// the keys (32 each) and the rest along the head dim; dQ has S's warps along the queries and
// the rest along the head dim.
// The order of the three products after the barrier: 2 (default) dV, then dQ and its hand-over,
// then dK, as FlashAttention-2 orders them; 1 dQ first, then dV and dK; 0 dV and dK together,
// then dQ. 1 and 2 are 4% faster than 0 on the H100 (the chapter's measurement).
#ifndef ATTENTION_ONE_PASS_ORDER
#define ATTENTION_ONE_PASS_ORDER 2
#endif
#ifndef ATTENTION_ONE_PASS_Q_STAGES
#define ATTENTION_ONE_PASS_Q_STAGES 3
#endif
template <int HEAD_DIM_, int BLOCK_Q_, int BLOCK_KV_, int WARPS_>
struct OnePassTiles {
    static constexpr int HEAD_DIM = HEAD_DIM_, BLOCK_Q = BLOCK_Q_, BLOCK_KV = BLOCK_KV_;
    static constexpr int WARPS = WARPS_, THREADS = 32 * WARPS;
    static constexpr int BLOCKS_PER_SM = WARPS == 4 ? 2 : 1;  // for __launch_bounds__
    static constexpr int Q_WARPS = BLOCK_Q / 32;        // S, dP and dQ: warps along queries
    static constexpr int K_WARPS = WARPS / Q_WARPS;     // ... and along keys (dims for dQ)
    static constexpr int KEY_WARPS = BLOCK_KV / 32;     // dK and dV: warps along keys
    static constexpr int DIM_WARPS = WARPS / KEY_WARPS;  // ... and along the head dim
    static_assert(Q_WARPS * K_WARPS == WARPS && KEY_WARPS * DIM_WARPS == WARPS, "warp grids");
    static constexpr int KV_TILE = BLOCK_KV * HEAD_DIM;
    static constexpr int Q_TILE = BLOCK_Q * HEAD_DIM;
    static constexpr int SCORE_TILE = BLOCK_Q * BLOCK_KV;
    // Q and dO arrive Q_STAGES - 1 tiles ahead of their use (cp.async groups): three stages on
    // Hopper, two before it, where shared memory is smaller.
    static constexpr int HOPPER_Q_STAGES = ATTENTION_ONE_PASS_Q_STAGES, OLDER_Q_STAGES = 2;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    static constexpr int Q_STAGES = OLDER_Q_STAGES;
#else
    static constexpr int Q_STAGES = HOPPER_Q_STAGES;
#endif
    static_assert(HOPPER_Q_STAGES >= 2, "at least double buffering");
    static_assert(sizeof(float) * K_WARPS * BLOCK_Q <= sizeof(bf16) * SCORE_TILE, "row sums fit");
    // dQ = dS K: each warp's 32 queries x DQ_DIMS dims, DQ_FRAGMENTS accumulator fragments of
    // 4 floats per lane. The FP32 accumulator in global memory keeps them in that order: one
    // chunk of BLOCK_Q x HEAD_DIM floats per (head, query tile), [warp][fragment][lane][4]
    // inside it, so that a warp's share is DQ_WARP_FLOATS consecutive floats.
    static constexpr int DQ_DIMS = HEAD_DIM / K_WARPS;
    static constexpr int DQ_D_TILES = DQ_DIMS / 8;
    static constexpr int DQ_FRAGMENTS = 2 * DQ_D_TILES;
    static constexpr int DQ_WARP_FLOATS = DQ_FRAGMENTS * 32 * 4;
    static_assert(DQ_WARP_FLOATS * WARPS == Q_TILE, "the warps' dQ shares tile the chunk");
    // K, V; Q_STAGES buffers each of Q and dO; P and dS; LSE and D, two buffers each (the
    // per-warp row sums of the exact D borrow P's space); on Hopper, where the block stages its
    // dQ in shared memory for the copy engine (cp.reduce.async.bulk), one FP32 Q tile more.
    // 225 KiB at D = 128 on Hopper (of the 227 a block may have), 161 KiB before it.
    static constexpr size_t shared_bytes(bool hopper) {
        return sizeof(bf16) * (2 * size_t(KV_TILE) + 2 * size_t(hopper ? HOPPER_Q_STAGES : OLDER_Q_STAGES) * Q_TILE +
                               2 * size_t(SCORE_TILE)) +
               sizeof(float) * 4 * BLOCK_Q + (hopper ? sizeof(float) * size_t(Q_TILE) : 0);
    }
};
// The tilings the launcher uses; -DATTENTION_ONE_PASS_SMALL=1 builds the 4-warp, 64-key
// alternative (two blocks per SM) that the chapter measures against them.
#ifndef ATTENTION_ONE_PASS_SMALL
#define ATTENTION_ONE_PASS_SMALL 0
#endif
template <int HEAD_DIM>
using OnePassConfig = std::conditional_t<
    ATTENTION_ONE_PASS_SMALL != 0, OnePassTiles<HEAD_DIM, 64, 64, 4>,
    OnePassTiles<HEAD_DIM, HEAD_DIM == 64 ? 128 : 64, 128, 8>>;

template <class Tiles>
__global__ void __launch_bounds__(Tiles::THREADS, Tiles::BLOCKS_PER_SM)
one_pass_backward_kernel(const bf16* __restrict__ Q, const bf16* __restrict__ K,
                         const bf16* __restrict__ V, const bf16* __restrict__ dO,
                         const float* __restrict__ lse, const float* __restrict__ delta,
                         bf16* __restrict__ dK, bf16* __restrict__ dV,
                         float* __restrict__ dq_accum, float* __restrict__ ds_rowsum, int len_q,
                         int len_kv, int kv_blocks, float scale, bool causal) {
    constexpr int HEAD_DIM = Tiles::HEAD_DIM;
    using Layout = Tile<HEAD_DIM>;
    using ScoreTile = Tile<Tiles::BLOCK_KV>;  // P and dS: one row of BLOCK_KV keys per query
    constexpr int BLOCK_Q = Tiles::BLOCK_Q, BLOCK_KV = Tiles::BLOCK_KV;
    constexpr int Q_WARPS = Tiles::Q_WARPS, K_WARPS = Tiles::K_WARPS;
    constexpr int S_KEYS = BLOCK_KV / K_WARPS;  // keys of S and dP per warp
    constexpr int S_TILES = S_KEYS / 8;
    constexpr int K_STEPS = HEAD_DIM / 16;     // k-steps of S and dP (over the head dim)
    constexpr int Q_STEPS = BLOCK_Q / 16;      // k-steps of dV and dK (over the queries)
    constexpr int KV_STEPS = BLOCK_KV / 16;    // k-steps of dQ (over the keys)
    constexpr int KV_DIMS = HEAD_DIM / Tiles::DIM_WARPS;  // dims of dK and dV per warp
    constexpr int DQ_DIMS = Tiles::DQ_DIMS;  // dims of dQ per warp
    constexpr int KV_D_TILES = KV_DIMS / 8, DQ_D_TILES = Tiles::DQ_D_TILES;
    const float scale_log2 = scale * LOG2E;

    extern __shared__ __align__(128) unsigned char shared_raw[];
    bf16* k_tile = reinterpret_cast<bf16*>(shared_raw);
    bf16* v_tile = k_tile + Tiles::KV_TILE;
    constexpr int Q_STAGES = Tiles::Q_STAGES;
    bf16* q_tiles = v_tile + Tiles::KV_TILE;                 // Q_STAGES buffers
    bf16* do_tiles = q_tiles + Q_STAGES * Tiles::Q_TILE;     // Q_STAGES buffers
    bf16* p_tile = do_tiles + Q_STAGES * Tiles::Q_TILE;      // [query][key]
    bf16* ds_tile = p_tile + Tiles::SCORE_TILE;      // [query][key]
    float* lse_log2 = reinterpret_cast<float*>(ds_tile + Tiles::SCORE_TILE);  // two buffers
    float* delta_tiles = lse_log2 + 2 * BLOCK_Q;                              // two buffers
    // [K_WARPS][BLOCK_Q], exact D only: used before P is written, after the last tile's P is read.
    float* warp_sums = reinterpret_cast<float*>(p_tile);
    // Hopper: this warp's dQ on its way to the accumulator (a Q tile of floats in all).
    float* dq_stage = delta_tiles + 2 * BLOCK_Q + int(threadIdx.x) / 32 * Tiles::DQ_WARP_FLOATS;

    // Heads are the slow index, so the blocks in flight share the Q, dO and dQ of few heads.
    const int64_t head = int(blockIdx.x) / kv_blocks;
    const int k0 = (int(blockIdx.x) % kv_blocks) * BLOCK_KV;
    const bf16* q_head = Q + head * len_q * HEAD_DIM;
    const bf16* do_head = dO + head * len_q * HEAD_DIM;
    const float* lse_head = lse + head * len_q;
    const float* delta_head = delta + head * len_q;
    // One block holding every key sees whole rows of P and dP: D = rowsum(P * dP) exactly.
    const bool exact_delta = kv_blocks == 1;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    // S and dP: queries s_q.. (32), keys s_k.. (S_KEYS). dK and dV: keys kv_k.. (32), dims
    // kv_d.. (D/2). dQ: queries s_q.. (32), dims dq_d.. (DQ_DIMS).
    const int s_q = (warp % Q_WARPS) * 32, s_k = (warp / Q_WARPS) * S_KEYS;
    const int kv_k = (warp / Tiles::DIM_WARPS) * 32, kv_d = (warp % Tiles::DIM_WARPS) * KV_DIMS;
    const int dq_d = (warp / Q_WARPS) * DQ_DIMS;

    float dk_acc[2][KV_D_TILES][4] = {};
    float dv_acc[2][KV_D_TILES][4] = {};

    // Causal: queries before k0 see none of these keys; skip their tiles.
    const int q_tile_count = ceil_div(len_q, BLOCK_Q);
    const int first_tile = causal ? k0 / BLOCK_Q : 0;

    // LSE (in the exp2 domain) and D of one query tile, one row per thread of the first
    // BLOCK_Q: loaded into registers a tile ahead and stored to shared memory once this tile's
    // work is done, so that no warp waits for them. Rows past the end get LSE = +inf, so that
    // their P is exactly 0 and they add nothing to dK or dV.
    static_assert(BLOCK_Q <= Tiles::THREADS, "one row per thread");
    const bool stats_thread = int(threadIdx.x) < BLOCK_Q;
    float next_lse = INFINITY, next_delta = 0.0f;
    auto load_row_stats = [&](int tile) {
        const int row = tile * BLOCK_Q + int(threadIdx.x);
        next_lse = INFINITY;
        next_delta = 0.0f;
        if (stats_thread && row < len_q) {
            next_lse = lse_head[row];
            next_delta = delta_head[row];
        }
    };
    auto store_row_stats = [&](int buffer) {
        if (stats_thread) {
            lse_log2[buffer * BLOCK_Q + threadIdx.x] = next_lse * LOG2E;
            delta_tiles[buffer * BLOCK_Q + threadIdx.x] = next_delta;
        }
    };

    // Q and dO of a query tile into stage `stage`, as one cp.async group (an empty group past
    // the last tile, so that every tile accounts for exactly one group).
    auto load_query_tile = [&](int tile, int stage) {
        if (tile < q_tile_count) {
            load_tile<BLOCK_Q, HEAD_DIM, Tiles::THREADS>(q_tiles + stage * Tiles::Q_TILE, q_head,
                                                           tile * BLOCK_Q, len_q);
            load_tile<BLOCK_Q, HEAD_DIM, Tiles::THREADS>(do_tiles + stage * Tiles::Q_TILE, do_head,
                                                           tile * BLOCK_Q, len_q);
        }
        cp_async_commit();
    };
    if (first_tile < q_tile_count) {
        load_tile<BLOCK_KV, HEAD_DIM, Tiles::THREADS>(k_tile, K + head * len_kv * HEAD_DIM, k0, len_kv);
        load_tile<BLOCK_KV, HEAD_DIM, Tiles::THREADS>(v_tile, V + head * len_kv * HEAD_DIM, k0, len_kv);
        load_query_tile(first_tile, 0);  // the first group: K, V and the first Q and dO
        for (int ahead = 1; ahead < Q_STAGES - 1; ++ahead) load_query_tile(first_tile + ahead, ahead);
        load_row_stats(first_tile);
        store_row_stats(0);
    }

    // excerpt: loop-top
    int stage = 0;  // (tile - first_tile) % Q_STAGES
    for (int tile = first_tile; tile < q_tile_count; ++tile) {
        const int buffer = (tile - first_tile) % 2;  // of LSE and D
        // This tile's Q and dO have landed (the Q_STAGES - 2 newer groups may still be in
        // flight); the barrier also tells that every warp is done with the last tile, so its
        // stage, P and dS may be rewritten.
        cp_async_wait<Q_STAGES - 2>();
        __syncthreads();
        load_query_tile(tile + Q_STAGES - 1, stage == 0 ? Q_STAGES - 1 : stage - 1);
        if (tile + 1 < q_tile_count) load_row_stats(tile + 1);
        const bf16* q_tile = q_tiles + stage * Tiles::Q_TILE;
        const bf16* do_tile = do_tiles + stage * Tiles::Q_TILE;
        stage = stage == Q_STAGES - 1 ? 0 : stage + 1;
        const float* tile_lse = lse_log2 + buffer * BLOCK_Q;
        float* tile_delta = delta_tiles + buffer * BLOCK_Q;
        const int q0 = tile * BLOCK_Q;
    // end excerpt

        // S = Q K^T and dP = dO V^T, this warp's 32 x 32 of each.
        float s[2][S_TILES][4] = {}, dp[2][S_TILES][4] = {};
#pragma unroll
        for (int ks = 0; ks < K_STEPS; ++ks) {
            uint32_t a[2][4], a2[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                load_a<Layout>(a[mt], q_tile, s_q + mt * 16, ks * 16, lane);
                load_a<Layout>(a2[mt], do_tile, s_q + mt * 16, ks * 16, lane);
            }
#pragma unroll
            for (int np = 0; np < S_TILES / 2; ++np) {
                uint32_t b[4];
                load_b<Layout>(b, k_tile, s_k + np * 16, ks * 16, lane);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    mma_m16n8k16_bf16(s[mt][2 * np], a[mt], b[0], b[1]);
                    mma_m16n8k16_bf16(s[mt][2 * np + 1], a[mt], b[2], b[3]);
                }
                load_b<Layout>(b, v_tile, s_k + np * 16, ks * 16, lane);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    mma_m16n8k16_bf16(dp[mt][2 * np], a2[mt], b[0], b[1]);
                    mma_m16n8k16_bf16(dp[mt][2 * np + 1], a2[mt], b[2], b[3]);
                }
            }
        }

        // P = exp2(S scale log2e - LSE log2e): the forward's max and sum, through its LSE.
        // Masked: keys past len_kv, and (causal) keys after the query.
        const bool needs_mask = k0 + BLOCK_KV > len_kv || (causal && k0 + BLOCK_KV - 1 > q0);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = s_q + mt * 16 + g + r * 8;
                const float row_lse = tile_lse[row];
#pragma unroll
                for (int nt = 0; nt < S_TILES; ++nt)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        float p = fast_exp2(s[mt][nt][2 * r + c] * scale_log2 - row_lse);
                        if (needs_mask) {
                            const int key = k0 + s_k + nt * 8 + 2 * t + c;
                            if (key >= len_kv || (causal && key > q0 + row)) p = 0.0f;
                        }
                        s[mt][nt][2 * r + c] = p;
                    }
            }
        if (exact_delta) {
            // Row sums of P * dP over this warp's keys, then over the K_WARPS key groups.
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    float sum = 0.0f;
#pragma unroll
                    for (int nt = 0; nt < S_TILES; ++nt)
                        sum += s[mt][nt][2 * r] * dp[mt][nt][2 * r] +
                               s[mt][nt][2 * r + 1] * dp[mt][nt][2 * r + 1];
                    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                    if (t == 0) warp_sums[(warp / Q_WARPS) * BLOCK_Q + s_q + mt * 16 + g + r * 8] = sum;
                }
            __syncthreads();
            if (stats_thread) {
                float sum = 0.0f;
#pragma unroll
                for (int w = 0; w < K_WARPS; ++w) sum += warp_sums[w * BLOCK_Q + threadIdx.x];
                tile_delta[threadIdx.x] = sum;
            }
            __syncthreads();
        }
        // excerpt: ds
        // dS = P (dP - D); its scale is applied once, to dK and dQ at the end. P and dS go to
        // shared memory as bf16; rowsum(dS) goes to the workspace with the tile's dQ (below),
        // for the centred dQ.
        float ds_sums[2][2];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = s_q + mt * 16 + g + r * 8;
                const float row_delta = tile_delta[row];
                float& sum = ds_sums[mt][r];
                sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < S_TILES; ++nt) {
                    const float* p = &s[mt][nt][2 * r];
                    float* ds = &dp[mt][nt][2 * r];
                    ds[0] = p[0] * (ds[0] - row_delta);
                    ds[1] = p[1] * (ds[1] - row_delta);
                    sum += ds[0] + ds[1];
                    const int column = s_k + nt * 8 + 2 * t;
                    store_bf16x2(p_tile + ScoreTile::offset(row, column), p[0], p[1]);
                    store_bf16x2(ds_tile + ScoreTile::offset(row, column), ds[0], ds[1]);
                }
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            }
        __syncthreads();  // P and dS are complete
        // end excerpt

        // dV += P^T dO and dK += dS^T Q: A operands P^T, dS^T read transposed from the tiles.
        auto dv_dk_products = [&](auto with_dv, auto with_dk) {
#pragma unroll
            for (int kq = 0; kq < Q_STEPS; ++kq) {
                uint32_t p_fragment[2][4], ds_fragment[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    if constexpr (decltype(with_dv)::value)
                        load_a_transposed<ScoreTile>(p_fragment[mt], p_tile, kv_k + mt * 16, kq * 16, lane);
                    if constexpr (decltype(with_dk)::value)
                        load_a_transposed<ScoreTile>(ds_fragment[mt], ds_tile, kv_k + mt * 16, kq * 16, lane);
                }
#pragma unroll
                for (int np = 0; np < KV_D_TILES / 2; ++np) {
                    uint32_t b[4];
                    if constexpr (decltype(with_dv)::value) {
                        load_b_transposed<Layout>(b, do_tile, kv_d + np * 16, kq * 16, lane);
#pragma unroll
                        for (int mt = 0; mt < 2; ++mt) {
                            mma_m16n8k16_bf16(dv_acc[mt][2 * np], p_fragment[mt], b[0], b[1]);
                            mma_m16n8k16_bf16(dv_acc[mt][2 * np + 1], p_fragment[mt], b[2], b[3]);
                        }
                    }
                    if constexpr (decltype(with_dk)::value) {
                        load_b_transposed<Layout>(b, q_tile, kv_d + np * 16, kq * 16, lane);
#pragma unroll
                        for (int mt = 0; mt < 2; ++mt) {
                            mma_m16n8k16_bf16(dk_acc[mt][2 * np], ds_fragment[mt], b[0], b[1]);
                            mma_m16n8k16_bf16(dk_acc[mt][2 * np + 1], ds_fragment[mt], b[2], b[3]);
                        }
                    }
                }
            }
        };
        auto dq_product = [&]() {
            // dQ(tile) += dS K over this block's keys, into the FP32 accumulator.
            float dq_acc[2][DQ_D_TILES][4] = {};
#pragma unroll
            for (int kk = 0; kk < KV_STEPS; ++kk) {
                uint32_t a[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
                    load_a<ScoreTile>(a[mt], ds_tile, s_q + mt * 16, kk * 16, lane);
#pragma unroll
                for (int np = 0; np < DQ_D_TILES / 2; ++np) {
                    uint32_t b[4];
                    load_b_transposed<Layout>(b, k_tile, dq_d + np * 16, kk * 16, lane);
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) {
                        mma_m16n8k16_bf16(dq_acc[mt][2 * np], a[mt], b[0], b[1]);
                        mma_m16n8k16_bf16(dq_acc[mt][2 * np + 1], a[mt], b[2], b[3]);
                    }
                }
            }
            // excerpt: dq-hand-over
            // This warp's share of the tile's chunk of the accumulator. Rows past len_q add zeros
            // (their P is 0) to padding that convert_dq_kernel never reads.
            float* dq_share = dq_accum + (head * q_tile_count + tile) * int64_t(Tiles::Q_TILE) +
                              warp * Tiles::DQ_WARP_FLOATS;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            // Hopper: the warp writes its fragments to shared memory (conflict-free, 16 bytes per
            // lane, lanes consecutive) and its lane 0 hands them to the copy engine, which adds
            // them to the accumulator while the warp moves on; before rewriting the stage, lane 0
            // waits until the copy engine has read the last tile's share.
            if (lane == 0) bulk_wait_read<0>();
            __syncwarp();
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int nt = 0; nt < DQ_D_TILES; ++nt)
                    *reinterpret_cast<float4*>(dq_stage + ((mt * DQ_D_TILES + nt) * 32 + lane) * 4) =
                        make_float4(dq_acc[mt][nt][0], dq_acc[mt][nt][1], dq_acc[mt][nt][2],
                                    dq_acc[mt][nt][3]);
            fence_proxy_async_shared();
            __syncwarp();
            if (lane == 0) {
                bulk_reduce_add_f32(dq_share, smem_address(dq_stage),
                                    Tiles::DQ_WARP_FLOATS * sizeof(float));
                bulk_commit();
            }
#else
            // Elsewhere: FP32 atomics, in the same order (the four instructions of a fragment
            // together add 512 consecutive bytes).
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int nt = 0; nt < DQ_D_TILES; ++nt)
#pragma unroll
                    for (int i = 0; i < 4; ++i)
                        atomicAdd(dq_share + ((mt * DQ_D_TILES + nt) * 32 + lane) * 4 + i,
                                  dq_acc[mt][nt][i]);
#endif
            // end excerpt
            // After the hand-over above: its fence would otherwise wait for these atomics.
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int row = q0 + s_q + mt * 16 + g + r * 8;
                    if (t == 0 && row < len_q)
                        atomicAdd(ds_rowsum + head * len_q + row, ds_sums[mt][r]);
                }
        };
        // excerpt: product-order
        // dV first (its P tile is read by nothing else), then dQ, whose hand-over to the copy
        // engine leaves while the warp still has dK's mma to issue, then dK.
        using yes = std::true_type;
        using no = std::false_type;
#if ATTENTION_ONE_PASS_ORDER == 0
        dv_dk_products(yes{}, yes{});
        dq_product();
#elif ATTENTION_ONE_PASS_ORDER == 1
        dq_product();
        dv_dk_products(yes{}, yes{});
#else
        dv_dk_products(yes{}, no{});
        dq_product();
        dv_dk_products(no{}, yes{});
#endif
        if (tile + 1 < q_tile_count) store_row_stats(1 - buffer);
        // end excerpt
    }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (lane == 0) bulk_wait<0>();  // the stage must outlive the copy engine's reads
#endif
    // Keys past the end are not stored; keys no query sees (causal) get exact zeros.
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int key = k0 + kv_k + mt * 16 + g + r * 8;
            if (key >= len_kv) continue;
            bf16* dk_row = dK + (head * len_kv + key) * HEAD_DIM + kv_d;
            bf16* dv_row = dV + (head * len_kv + key) * HEAD_DIM + kv_d;
#pragma unroll
            for (int nt = 0; nt < KV_D_TILES; ++nt) {
                store_bf16x2(dk_row + nt * 8 + 2 * t, dk_acc[mt][nt][2 * r] * scale,
                             dk_acc[mt][nt][2 * r + 1] * scale);
                store_bf16x2(dv_row + nt * 8 + 2 * t, dv_acc[mt][nt][2 * r], dv_acc[mt][nt][2 * r + 1]);
            }
        }
}

// ---- backward 3: the FP32 dQ accumulator, centred, scaled, to bf16 ------------------------
// dQ_i = scale sum_j dS_ij K_j = scale (sum_j dS_ij (K_j - c) + (sum_j dS_ij) c) for any c, and
// sum_j dS_ij = D_i(exact) - D_i(used) is zero in exact arithmetic. With D from the bf16 O it
// is not, and its error times c = mean of K is the largest error in dQ at long lengths; so the
// kernels keep sum_j dS_ij and this subtracts (sum_j dS_ij) mean(K): the centred form.
// The accumulator is in the one-pass kernel's order (OnePassTiles): each thread takes one lane's
// 4 floats of one fragment, i.e. 2 neighbouring dims of 2 rows 8 apart.
template <class Tiles>
__global__ void convert_dq_kernel(const float* __restrict__ dq_accum,
                                  const float* __restrict__ ds_rowsum,
                                  const float* __restrict__ key_sum, bf16* __restrict__ dQ,
                                  int64_t fragments, int len_q, int q_tiles, float inverse_len_kv,
                                  float scale) {
    constexpr int HEAD_DIM = Tiles::HEAD_DIM;
    constexpr int CHUNK_FRAGMENTS = Tiles::Q_TILE / 4;  // float4s per (head, query tile)
    for (int64_t f = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; f < fragments;
         f += int64_t(gridDim.x) * blockDim.x) {
        const int64_t chunk = f / CHUNK_FRAGMENTS;
        const int within = int(f % CHUNK_FRAGMENTS);
        const int warp = within / (Tiles::DQ_FRAGMENTS * 32);
        const int fragment = within / 32 % Tiles::DQ_FRAGMENTS;
        const int lane = within % 32;
        const int mt = fragment / Tiles::DQ_D_TILES, nt = fragment % Tiles::DQ_D_TILES;
        const int64_t head = chunk / q_tiles;
        const int row0 = int(chunk % q_tiles) * Tiles::BLOCK_Q + (warp % Tiles::Q_WARPS) * 32 +
                         mt * 16 + lane / 4;
        const int d = (warp / Tiles::Q_WARPS) * Tiles::DQ_DIMS + nt * 8 + 2 * (lane % 4);
        const float4 value = reinterpret_cast<const float4*>(dq_accum)[f];
        const float2 sums = *reinterpret_cast<const float2*>(key_sum + head * HEAD_DIM + d);
        // rowsum(dS) * mean(K) = (rowsum(dS) / len_kv) * sum(K)
        if (row0 < len_q) {
            const float weight = ds_rowsum[head * len_q + row0] * inverse_len_kv;
            store_bf16x2(dQ + (head * len_q + row0) * HEAD_DIM + d, (value.x - weight * sums.x) * scale,
                         (value.y - weight * sums.y) * scale);
        }
        if (row0 + 8 < len_q) {
            const float weight = ds_rowsum[head * len_q + row0 + 8] * inverse_len_kv;
            store_bf16x2(dQ + (head * len_q + row0 + 8) * HEAD_DIM + d,
                         (value.z - weight * sums.x) * scale, (value.w - weight * sums.y) * scale);
        }
    }
}

// Column sums of K per (batch, head), in a fixed order so that the result (and the dQ that
// uses it) is the same from run to run: first one partial sum per 64-key slice, one column per
// thread, then one thread per column adds the slices up in order.
constexpr int KEY_SUM_ROWS = 64;

template <int HEAD_DIM>
__global__ void __launch_bounds__(HEAD_DIM)
key_partial_sum_kernel(const bf16* __restrict__ K, float* __restrict__ partial, int len_kv) {
    const int64_t head = blockIdx.x;
    const int begin = blockIdx.y * KEY_SUM_ROWS;
    const int end = min(len_kv, begin + KEY_SUM_ROWS);
    const bf16* column = K + head * len_kv * HEAD_DIM + threadIdx.x;
    float sum = 0.0f;
    for (int j = begin; j < end; ++j) sum += __bfloat162float(column[int64_t(j) * HEAD_DIM]);
    partial[(head * gridDim.y + blockIdx.y) * HEAD_DIM + threadIdx.x] = sum;
}

template <int HEAD_DIM>
__global__ void __launch_bounds__(HEAD_DIM)
key_sum_kernel(const float* __restrict__ partial, float* __restrict__ key_sum, int slices) {
    const int64_t head = blockIdx.x;
    float sum = 0.0f;
    for (int slice = 0; slice < slices; ++slice)
        sum += partial[(head * slices + slice) * HEAD_DIM + threadIdx.x];
    key_sum[head * HEAD_DIM + threadIdx.x] = sum;
}

// ---- second-kernel strategy, 2b: dQ by a kernel with the opposite loop order -------------
// One block of 4 warps per 64 query rows (16 per warp) walks the KV tiles, as the forward
// does: S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K, dQ in registers. It recomputes
// S and dP, which the dK/dV kernel already had: two extra matrix products instead of atomics.
constexpr int DQ_BLOCK_Q = 64;
constexpr int DQ_BLOCK_KV = 64;
constexpr int DQ_THREADS = 128;

template <int HEAD_DIM>
constexpr size_t dq_shared_bytes() {
    return sizeof(bf16) * size_t(HEAD_DIM) * (2 * DQ_BLOCK_Q + 4 * DQ_BLOCK_KV);
}

// The body of one dQ block: query tile `block` (counted from the last when causal, so that the
// longest walks start first) of head `head`, q_blocks such tiles per head.
template <int HEAD_DIM>
__device__ __forceinline__ void
dq_block(const bf16* __restrict__ Q, const bf16* __restrict__ K, const bf16* __restrict__ V,
          const bf16* __restrict__ dO, const float* __restrict__ lse,
          const float* __restrict__ delta, const float* __restrict__ key_sum,
          bf16* __restrict__ dQ, int len_q, int len_kv, float scale, bool causal, int64_t head, int block, int q_blocks) {
    using Layout = Tile<HEAD_DIM>;
    constexpr int K_STEPS = HEAD_DIM / 16;
    constexpr int D_TILES = HEAD_DIM / 8;
    constexpr int S_TILES = DQ_BLOCK_KV / 8;
    constexpr int TILE = DQ_BLOCK_KV * HEAD_DIM;
    const float scale_log2 = scale * LOG2E;

    extern __shared__ __align__(128) unsigned char shared_raw[];
    bf16* q_tile = reinterpret_cast<bf16*>(shared_raw);
    bf16* do_tile = q_tile + DQ_BLOCK_Q * HEAD_DIM;
    bf16* k_tiles = do_tile + DQ_BLOCK_Q * HEAD_DIM;
    bf16* v_tiles = k_tiles + 2 * TILE;

    const int q_block = causal ? q_blocks - 1 - block : block;
    const int q0 = q_block * DQ_BLOCK_Q;
    const bf16* k_head = K + head * len_kv * HEAD_DIM;
    const bf16* v_head = V + head * len_kv * HEAD_DIM;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int row_base = q0 + warp * 16 + g;

    // Per-row constants of this lane's two rows.
    float row_lse[2], row_delta[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row_base + r * 8;
        row_lse[r] = row < len_q ? lse[head * len_q + row] * LOG2E : INFINITY;
        row_delta[r] = row < len_q ? delta[head * len_q + row] : 0.0f;
    }

    const int kv_end = causal ? min(len_kv, q0 + DQ_BLOCK_Q) : len_kv;
    const int tiles = (kv_end + DQ_BLOCK_KV - 1) / DQ_BLOCK_KV;

    load_tile<DQ_BLOCK_Q, HEAD_DIM, DQ_THREADS>(q_tile, Q + head * len_q * HEAD_DIM, q0, len_q);
    load_tile<DQ_BLOCK_Q, HEAD_DIM, DQ_THREADS>(do_tile, dO + head * len_q * HEAD_DIM, q0, len_q);
    load_tile<DQ_BLOCK_KV, HEAD_DIM, DQ_THREADS>(k_tiles, k_head, 0, len_kv);
    load_tile<DQ_BLOCK_KV, HEAD_DIM, DQ_THREADS>(v_tiles, v_head, 0, len_kv);
    cp_async_commit();

    float dq_acc[D_TILES][4] = {};
    constexpr bool QDO_IN_REGISTERS = HEAD_DIM == 64;
    uint32_t q_registers[QDO_IN_REGISTERS ? K_STEPS : 1][4];
    uint32_t do_registers[QDO_IN_REGISTERS ? K_STEPS : 1][4];
    float ds_rowsum[2] = {0.0f, 0.0f};  // this lane's part of sum_j dS_ij, for the centring
    for (int tile = 0; tile < tiles; ++tile) {
        // Not the last tile: prefetch the next. (!= rather than <, equal here, keeps ptxas from
        // spilling in dkdv_dq_kernel<128>.)
        if (tile + 1 != tiles) {
            const int next = (tile + 1) % 2;
            load_tile<DQ_BLOCK_KV, HEAD_DIM, DQ_THREADS>(k_tiles + next * TILE, k_head,
                                                         (tile + 1) * DQ_BLOCK_KV, len_kv);
            load_tile<DQ_BLOCK_KV, HEAD_DIM, DQ_THREADS>(v_tiles + next * TILE, v_head,
                                                         (tile + 1) * DQ_BLOCK_KV, len_kv);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* k_tile = k_tiles + (tile % 2) * TILE;
        const bf16* v_tile = v_tiles + (tile % 2) * TILE;
        // At D = 64 the warp's Q and dO fragments stay in registers for the whole walk.
        if constexpr (QDO_IN_REGISTERS) {
            if (tile == 0) {
#pragma unroll
                for (int ks = 0; ks < K_STEPS; ++ks) {
                    load_a<Layout>(q_registers[ks], q_tile, warp * 16, ks * 16, lane);
                    load_a<Layout>(do_registers[ks], do_tile, warp * 16, ks * 16, lane);
                }
            }
        }

        // S = Q K^T and dP = dO V^T for this warp's 16 rows.
        float s[S_TILES][4] = {};
        float dp[S_TILES][4] = {};
        scores_and_gradients<Layout, QDO_IN_REGISTERS>(s, dp, q_registers, do_registers, q_tile,
                                                       do_tile, warp * 16, k_tile, v_tile, lane);
        const int kv0 = tile * DQ_BLOCK_KV;
#pragma unroll
        for (int nt = 0; nt < S_TILES; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = row_base + (e / 2) * 8;
                const int key = kv0 + nt * 8 + 2 * t + e % 2;
                const bool masked = key >= len_kv || (causal && key > row);
                const float p = masked ? 0.0f : fast_exp2(s[nt][e] * scale_log2 - row_lse[e / 2]);
                dp[nt][e] = p * (dp[nt][e] - row_delta[e / 2]);
                ds_rowsum[e / 2] += dp[nt][e];
            }
#pragma unroll
        for (int kk = 0; kk < DQ_BLOCK_KV / 16; ++kk) {
            uint32_t a[4];
            accumulators_to_a(a, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
            for (int np = 0; np < D_TILES / 2; ++np) {
                uint32_t b[4];
                load_b_transposed<Layout>(b, k_tile, np * 16, kk * 16, lane);
                mma_m16n8k16_bf16(dq_acc[2 * np], a, b[0], b[1]);
                mma_m16n8k16_bf16(dq_acc[2 * np + 1], a, b[2], b[3]);
            }
        }
        __syncthreads();
    }

    // The centred form, as convert_dq_kernel applies it to the atomic strategy's accumulator.
    const float* key_sums = key_sum + head * HEAD_DIM;
    const float inverse_len_kv = 1.0f / float(len_kv);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        ds_rowsum[r] += __shfl_xor_sync(0xffffffffu, ds_rowsum[r], 1);
        ds_rowsum[r] += __shfl_xor_sync(0xffffffffu, ds_rowsum[r], 2);
        ds_rowsum[r] *= inverse_len_kv;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row_base + r * 8;
        if (row >= len_q) continue;
        bf16* dq_row = dQ + (head * len_q + row) * HEAD_DIM;
#pragma unroll
        for (int dt = 0; dt < D_TILES; ++dt) {
            const int d = dt * 8 + 2 * t;
            store_bf16x2(dq_row + d, (dq_acc[dt][2 * r] - ds_rowsum[r] * key_sums[d]) * scale,
                         (dq_acc[dt][2 * r + 1] - ds_rowsum[r] * key_sums[d + 1]) * scale);
        }
    }
}

template <int HEAD_DIM>
__global__ void __launch_bounds__(DQ_THREADS, 2)
dq_kernel(const bf16* __restrict__ Q, const bf16* __restrict__ K, const bf16* __restrict__ V,
          const bf16* __restrict__ dO, const float* __restrict__ lse,
          const float* __restrict__ delta, const float* __restrict__ key_sum,
          bf16* __restrict__ dQ, int len_q, int len_kv, float scale, bool causal) {
    dq_block<HEAD_DIM>(Q, K, V, dO, lse, delta, key_sum, dQ, len_q, len_kv, scale, causal,
                       blockIdx.x, blockIdx.y, gridDim.y);
}

// Both of the second-kernel strategy's kernels as one launch ("horizontal fusion"): the first
// kv_blocks rows of the grid are dK/dV blocks, the rest dQ blocks. Neither waits for the other
// (D comes from the preprocess kernel), so the dQ blocks fill the SMs that the dK/dV blocks'
// last wave leaves idle, instead of waiting for a second launch. Not used when one KV block
// makes D exact, because the dQ blocks would then read D while it is being written.
template <int HEAD_DIM>
__global__ void __launch_bounds__(BWD_THREADS, BWD_BLOCKS_PER_SM)
dkdv_dq_kernel(const bf16* __restrict__ Q, const bf16* __restrict__ K,
               const bf16* __restrict__ V, const bf16* __restrict__ dO,
               const float* __restrict__ lse, float* __restrict__ delta,
               const float* __restrict__ key_sum, bf16* __restrict__ dQ, bf16* __restrict__ dK,
               bf16* __restrict__ dV, int len_q, int len_kv, float scale, bool causal,
               int kv_blocks, int q_blocks) {
    static_assert(!kFuseSecondKernel || BWD_THREADS == DQ_THREADS, "one block size for both");
    if (int(blockIdx.y) < kv_blocks)
        dkdv_block<HEAD_DIM>(Q, K, V, dO, lse, delta, dK, dV, len_q, len_kv, scale, causal,
                             blockIdx.x, blockIdx.y, kv_blocks);
    else
        dq_block<HEAD_DIM>(Q, K, V, dO, lse, delta, key_sum, dQ, len_q, len_kv, scale, causal,
                           blockIdx.x, int(blockIdx.y) - kv_blocks, q_blocks);
}

// ---- launchers ------------------------------------------------------------------------------

// The workspace: D and rowsum(dS) per query row, the column sums of K per head and their
// per-slice partial sums, then, for the atomic strategy, the FP32 dQ accumulator.
struct WorkspaceLayout {
    size_t delta = 0, ds_rowsum = 0, key_sum = 0, key_partial = 0, dq_accum = 0, total = 0;
    size_t dq_accum_bytes = 0;
    WorkspaceLayout(const AttentionShape& shape, DqStrategy strategy) {
        auto rounded = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
        const size_t row_bytes = rounded(size_t(shape.lse_elements()) * sizeof(float));
        ds_rowsum = row_bytes;
        key_sum = 2 * row_bytes;
        const size_t heads = size_t(shape.batch) * shape.heads;
        key_partial = key_sum + rounded(heads * shape.head_dim * sizeof(float));
        const size_t slices = size_t(ceil_div(shape.len_kv, KEY_SUM_ROWS));
        dq_accum = key_partial + rounded(heads * slices * shape.head_dim * sizeof(float));
        // The accumulator: whole query tiles of the one-pass kernel, the last one padded.
        const int block_q = shape.head_dim == 64 ? OnePassConfig<64>::BLOCK_Q : OnePassConfig<128>::BLOCK_Q;
        const size_t accum_rows = heads * size_t(ceil_div(shape.len_q, block_q)) * block_q;
        dq_accum_bytes = strategy == DqStrategy::atomic ? accum_rows * shape.head_dim * sizeof(float) : 0;
        total = dq_accum + dq_accum_bytes;
    }
};

template <int HEAD_DIM>
void launch_backward(DqStrategy strategy, const bf16* q, const bf16* k, const bf16* v,
                     const bf16* o, const float* lse, const bf16* dout, bf16* dq, bf16* dk,
                     bf16* dv, const AttentionShape& shape, cudaStream_t stream) {
    const bool atomic = strategy == DqStrategy::atomic;
    const WorkspaceLayout layout(shape, strategy);
    Workspace workspace(layout.total, stream);  // refuses, before any launch, what cannot fit
    char* base = workspace.as<char>();
    float* delta = reinterpret_cast<float*>(base + layout.delta);
    float* ds_rowsum = reinterpret_cast<float*>(base + layout.ds_rowsum);
    float* key_sum = reinterpret_cast<float*>(base + layout.key_sum);
    float* dq_accum = atomic ? reinterpret_cast<float*>(base + layout.dq_accum) : nullptr;
    const float scale = shape.softmax_scale();
    const unsigned heads = unsigned(shape.batch * shape.heads);
    const int64_t rows = shape.lse_elements();

    if (atomic) {
        CUDA_CHECK(cudaMemsetAsync(ds_rowsum, 0, size_t(rows) * sizeof(float), stream));
        CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, layout.dq_accum_bytes, stream));
    }
    const int pre_blocks = int(std::min<int64_t>((rows + 7) / 8, 65536));
    preprocess_kernel<HEAD_DIM><<<pre_blocks, PRE_THREADS, 0, stream>>>(o, dout, delta, rows);
    CUDA_CHECK(cudaGetLastError());
    const int slices = ceil_div(shape.len_kv, KEY_SUM_ROWS);
    float* key_partial = reinterpret_cast<float*>(base + layout.key_partial);
    key_partial_sum_kernel<HEAD_DIM><<<dim3(heads, unsigned(slices)), HEAD_DIM, 0, stream>>>(
        k, key_partial, shape.len_kv);
    CUDA_CHECK(cudaGetLastError());
    key_sum_kernel<HEAD_DIM><<<heads, HEAD_DIM, 0, stream>>>(key_partial, key_sum, slices);
    CUDA_CHECK(cudaGetLastError());

    if (atomic) {
        using Config = OnePassConfig<HEAD_DIM>;
        int device = 0, major = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        // Hopper and later: the kernel's sm_90 path (three Q stages, dQ staged for the copy engine).
        const size_t bytes = Config::shared_bytes(major >= 9);
        CUDA_CHECK(cudaFuncSetAttribute(one_pass_backward_kernel<Config>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
        const int kv_blocks = ceil_div(shape.len_kv, Config::BLOCK_KV);
        if (int64_t(heads) * kv_blocks > INT_MAX)
            throw std::invalid_argument("attention_backward: batch * heads * key tiles exceeds the grid");
        one_pass_backward_kernel<Config><<<heads * unsigned(kv_blocks), Config::THREADS, bytes, stream>>>(
            q, k, v, dout, lse, delta, dk, dv, dq_accum, ds_rowsum, shape.len_q, shape.len_kv,
            kv_blocks, scale, shape.causal);
        CUDA_CHECK(cudaGetLastError());
        const int64_t fragments = int64_t(layout.dq_accum_bytes / (4 * sizeof(float)));
        const int convert_blocks = int(std::min<int64_t>((fragments + 255) / 256, 65536));
        convert_dq_kernel<Config><<<convert_blocks, 256, 0, stream>>>(
            dq_accum, ds_rowsum, key_sum, dq, fragments, shape.len_q,
            ceil_div(shape.len_q, Config::BLOCK_Q), 1.0f / float(shape.len_kv), scale);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    constexpr size_t dkdv_bytes = BackwardTiles<HEAD_DIM>::shared_bytes();
    const dim3 kv_grid(heads, unsigned(ceil_div(shape.len_kv, BWD_BLOCK_KV)));
    if (kFuseSecondKernel && kv_grid.y > 1) {
        const int q_blocks = ceil_div(shape.len_q, DQ_BLOCK_Q);
        const size_t bytes = std::max(dkdv_bytes, dq_shared_bytes<HEAD_DIM>());
        CUDA_CHECK(cudaFuncSetAttribute(dkdv_dq_kernel<HEAD_DIM>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
        const dim3 grid(heads, kv_grid.y + unsigned(q_blocks));
        dkdv_dq_kernel<HEAD_DIM><<<grid, BWD_THREADS, bytes, stream>>>(
            q, k, v, dout, lse, delta, key_sum, dq, dk, dv, shape.len_q, shape.len_kv, scale,
            shape.causal, int(kv_grid.y), q_blocks);
        CUDA_CHECK(cudaGetLastError());
    } else {
        CUDA_CHECK(cudaFuncSetAttribute(dkdv_kernel<HEAD_DIM>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(dkdv_bytes)));
        dkdv_kernel<HEAD_DIM><<<kv_grid, BWD_THREADS, dkdv_bytes, stream>>>(
            q, k, v, dout, lse, delta, dk, dv, shape.len_q, shape.len_kv, scale, shape.causal);
        CUDA_CHECK(cudaGetLastError());
        constexpr size_t bytes = dq_shared_bytes<HEAD_DIM>();
        CUDA_CHECK(cudaFuncSetAttribute(dq_kernel<HEAD_DIM>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
        const dim3 q_grid(heads, unsigned(ceil_div(shape.len_q, DQ_BLOCK_Q)));
        dq_kernel<HEAD_DIM><<<q_grid, DQ_THREADS, bytes, stream>>>(
            q, k, v, dout, lse, delta, key_sum, dq, shape.len_q, shape.len_kv, scale, shape.causal);
        CUDA_CHECK(cudaGetLastError());
    }
}

}  // namespace

const StageCapabilities& stage_capabilities() {
    // 16-byte alignment: every cp.async moves 16 bytes.
    static const StageCapabilities caps{"07_backward", "bf16", {64, 128}, MAX_LENGTH,
                                        MAX_LENGTH, true, /*backward=*/true, 16};
    return caps;
}

size_t attention_workspace_bytes(const AttentionShape&) { return 0; }

void attention_forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                       const AttentionShape& shape, cudaStream_t stream) {
    validate_forward(shape, stage_capabilities(), q, k, v, o, lse);
    if (shape.head_dim == 64)
        launch<Tiling64>(q, k, v, o, lse, shape, stream);
    else
        launch<Tiling128>(q, k, v, o, lse, shape, stream);
}

size_t attention_backward_workspace_bytes(const AttentionShape& shape) {
    return WorkspaceLayout(shape, kDefaultDqStrategy).total;
}

void attention_backward_with(DqStrategy strategy, const bf16* q, const bf16* k, const bf16* v,
                             const bf16* o, const float* lse, const bf16* dout, bf16* dq,
                             bf16* dk, bf16* dv, const AttentionShape& shape,
                             cudaStream_t stream) {
    validate_backward(shape, stage_capabilities(), q, k, v, o, lse, dout, dq, dk, dv);
    if (shape.head_dim == 64)
        launch_backward<64>(strategy, q, k, v, o, lse, dout, dq, dk, dv, shape, stream);
    else
        launch_backward<128>(strategy, q, k, v, o, lse, dout, dq, dk, dv, shape, stream);
}

void attention_backward(const bf16* q, const bf16* k, const bf16* v, const bf16* o,
                        const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv,
                        const AttentionShape& shape, cudaStream_t stream) {
    attention_backward_with(kDefaultDqStrategy, q, k, v, o, lse, dout, dq, dk, dv, shape, stream);
}
