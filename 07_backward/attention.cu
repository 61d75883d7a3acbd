// Stage 07: the backward pass, added to stage 06's forward (06's kernel as it stands: it writes
// LSE, all the backward needs; make docs-check checks the copy character for character).
// The backward: (1) delta = rowsum(dO * O) per query row and the column sums of K; (2) one
// block per 128 keys walks every query tile, recomputes P, forms dS, keeps dK and dV in
// registers and adds its share of dQ = dS K to an FP32 accumulator; (3) dQ centred, scaled,
// rounded to bf16.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "attention.h"
#include "cuda_check.h"
#include "fragments.cuh"
#include "ptx.cuh"
#include "swizzle.h"
#include "validate.h"
#include "workspace.h"

namespace {

using bf16 = __nv_bfloat16;

// One kernel configuration. Each warp owns ROW_TILES mma tiles of 16 query rows: two tiles
// reuse every K and V fragment it loads twice, halving shared-memory reads per mma.
// K and V are both double-buffered: K_{j+1} and V_{j+1} are fetched during all of tile j, so
// one barrier per tile suffices.
// SKIP_UNCHANGED_RESCALE: skip the rescale of O by alpha, for the whole warp, on the tiles
// that leave every running max m of the warp unchanged. It saves multiplies but the branch
// splits the loop body, so the compiler cannot interleave one row tile's softmax with the
// other's P V mma. At D = 64 the multiplies are few and the tiling without the branch is
// faster; at D = 128 the interleaved body needs more registers than there are, and spills
// (the tuning experiment, bench/experiments/tune_06.cu, times both).
template <int HEAD_DIM_, int WARPS_, int ROW_TILES_, int BLOCK_KV_, int MIN_BLOCKS_,
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
    static constexpr bool SKIP_UNCHANGED_RESCALE = SKIP_UNCHANGED_RESCALE_;
    // Q fragments stay in registers when they are few; else they are re-read with ldmatrix.
    static constexpr bool Q_IN_REGISTERS = ROW_TILES * HEAD_DIM <= 128;
    static constexpr size_t SHARED_BYTES =
        size_t(BLOCK_Q + 4 * BLOCK_KV) * HEAD_DIM * sizeof(__nv_bfloat16);
};

// The tilings the launcher uses (make -C bench/experiments tune_06 times these and others).
using Tiling64 = Tiling<64, 4, 2, 64, 2, false>;
using Tiling128 = Tiling<128, 4, 2, 64, 1>;

constexpr float LOG2E = 1.4426950408889634f;
constexpr unsigned FULL_MASK = 0xffffffffu;

template <int HEAD_DIM>
using Tile = TileLayout<HEAD_DIM>;

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
    bf16* v_tiles = k_tiles + 2 * BLOCK_KV * HEAD_DIM;        // [2][BLOCK_KV][HEAD_DIM]
    constexpr uint32_t K_TILE_BYTES = BLOCK_KV * HEAD_DIM * sizeof(bf16);

    const int group_blocks = group_heads * q_tiles;
    const int group = int(blockIdx.x) / group_blocks;
    const int first_head = group * group_heads;
    const int heads_in_group = min(group_heads, batch_heads - first_head);
    const int rank = int(blockIdx.x) - group * group_blocks;
    const int q_block = q_tiles - 1 - rank / heads_in_group;
    const int64_t head = first_head + rank % heads_in_group;
    const int q_start = q_block * BLOCK_Q;
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
    if (causal) kv_tiles = min(kv_tiles, ceil_div(q_start + BLOCK_Q, BLOCK_KV));

    // Prologue: Q and the first K and V tiles, one group.
    load_tile<BLOCK_Q, HEAD_DIM, THREADS>(q_tile, q_head, q_start, len_q);
    load_tile<BLOCK_KV, HEAD_DIM, THREADS>(k_tiles, k_head, 0, len_kv);
    load_tile<BLOCK_KV, HEAD_DIM, THREADS>(v_tiles, v_head, 0, len_kv);
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
        for (int row_tile = 0; row_tile < ROW_TILES; ++row_tile)
#pragma unroll
            for (int step = 0; step < QK_STEPS; ++step)
                ldmatrix_x4(q_fragment[row_tile][step],
                            q_base[step % 4] + 2 * (row_tile * 16 * HEAD_DIM + step / 4 * 64));
    }

    // Per-lane ldmatrix addresses, swizzle included, computed once. Moving 8 rows down or 64
    // columns right moves every element of the tile by the same amount (the XOR depends on
    // row % 8 and touches only the low 3 bits of the chunk), so each access below is one of
    // these bases plus a constant. K, ldmatrix.x4: lanes 0-7 give keys 0-7 at dims 0-7 of the
    // step, lanes 8-15 the same keys at dims 8-15, lanes 16-31 keys 8-15 likewise: the B
    // operands of two 8-key tiles. V, ldmatrix.x4.trans: lanes 0-15 give keys 0-15 at dims
    // 0-7 of a 16-dim pair, lanes 16-31 at dims 8-15: the B operands of two 8-dim tiles.
    // k_base and v_base address the buffers of the current tile and flip between the two
    // each iteration.
    uint32_t k_base[4], v_base[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        k_base[c] = smem_address(k_tiles + Tile<HEAD_DIM>::offset(lane % 8 + (lane / 16) * 8,
                                                                  c * 16 + (lane / 8) % 2 * 8));
        v_base[c] = smem_address(v_tiles + Tile<HEAD_DIM>::offset(lane % 16, c * 16 + (lane / 16) * 8));
    }

    float o[ROW_TILES][O_TILES][4] = {};
    // Two rows per lane and row tile: [row_tile][0] is fragment_row, [row_tile][1] is
    // fragment_row + 8. m is the running max of the raw scores; l is this lane's share of the
    // running sum (its columns only), summed over the quad once at the end.
    float m[ROW_TILES][2], l[ROW_TILES][2];
#pragma unroll
    for (int row_tile = 0; row_tile < ROW_TILES; ++row_tile)
        for (int r = 0; r < 2; ++r) {
            m[row_tile][r] = -INFINITY;
            l[row_tile][r] = 0.0f;
        }
    const float scale_log2 = scale * LOG2E;  // exp(scale * x) = 2^(x * scale * log2 e)
    for (int kv_tile = 0; kv_tile < kv_tiles; ++kv_tile) {
        const int kv_start = kv_tile * BLOCK_KV;
        // K_j and V_j have landed: they are the only group in flight. The barrier also tells
        // that every warp is done with tile j-1, so its buffers may be refilled.
        cp_async_wait<0>();
        __syncthreads();
        bf16* next_k = k_tiles + ((kv_tile + 1) % 2) * BLOCK_KV * HEAD_DIM;
        if (kv_tile + 1 < kv_tiles) {
            load_tile<BLOCK_KV, HEAD_DIM, THREADS>(next_k, k_head, kv_start + BLOCK_KV, len_kv);
            load_tile<BLOCK_KV, HEAD_DIM, THREADS>(
                v_tiles + ((kv_tile + 1) % 2) * BLOCK_KV * HEAD_DIM, v_head, kv_start + BLOCK_KV, len_kv);
        }
        cp_async_commit();
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            refresh_register(k_base[c]);
            refresh_register(v_base[c]);
        }
        // S = Q K^T. K is stored [key][dim]: read as rows it is the column-major B operand
        // (dim x key) that mma wants, so no transpose.
        float s[ROW_TILES][S_TILES][4] = {};
#pragma unroll
        for (int step = 0; step < QK_STEPS; ++step) {
            uint32_t a[ROW_TILES][4];
#pragma unroll
            for (int row_tile = 0; row_tile < ROW_TILES; ++row_tile) {
                if constexpr (Config::Q_IN_REGISTERS) {
#pragma unroll
                    for (int i = 0; i < 4; ++i) a[row_tile][i] = q_fragment[row_tile][step][i];
                } else {
                    ldmatrix_x4(a[row_tile], q_base[step % 4] + 2 * (row_tile * 16 * HEAD_DIM + step / 4 * 64));
                }
            }
#pragma unroll
            for (int n = 0; n < S_TILES; n += 2) {
                uint32_t b[4];
                ldmatrix_x4(b, k_base[step % 4] + 2 * (n * 8 * HEAD_DIM + step / 4 * 64));
#pragma unroll
                for (int row_tile = 0; row_tile < ROW_TILES; ++row_tile) {
                    mma_m16n8k16_bf16(s[row_tile][n], a[row_tile], b[0], b[1]);
                    mma_m16n8k16_bf16(s[row_tile][n + 1], a[row_tile], b[2], b[3]);
                }
            }
        }
        // Mask only where a tile can hold a masked score: past len_kv, or above the diagonal.
        const bool needs_mask =
            kv_start + BLOCK_KV > len_kv || (causal && kv_start + BLOCK_KV - 1 > q_start + warp_row);
        if (needs_mask) {
#pragma unroll
            for (int row_tile = 0; row_tile < ROW_TILES; ++row_tile)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    // Column c of this lane's scores (key kv_start + c + fragment_column) is
                    // visible iff c < visible: one compare against a constant per score.
                    const int row = q_start + warp_row + row_tile * 16 + fragment_row + r * 8;
                    const int visible = (causal ? min(len_kv, row + 1) : len_kv) - kv_start - fragment_column;
#pragma unroll
                    for (int n = 0; n < S_TILES; ++n)
#pragma unroll
                        for (int i = 0; i < 2; ++i)
                            if (n * 8 + i >= visible) s[row_tile][n][2 * r + i] = -INFINITY;
                }
        }

        uint32_t p_fragment[ROW_TILES][PV_STEPS][4];
#pragma unroll
        for (int row_tile = 0; row_tile < ROW_TILES; ++row_tile) {
            // Online softmax in FP32. A row is spread over the 4 lanes of a quad: reduce
            // its max with two butterfly shuffles (lane ^ 1, lane ^ 2).
            float m_new[2] = {m[row_tile][0], m[row_tile][1]};
#pragma unroll
            for (int n = 0; n < S_TILES; ++n) {
                m_new[0] = fmaxf(m_new[0], fmaxf(s[row_tile][n][0], s[row_tile][n][1]));
                m_new[1] = fmaxf(m_new[1], fmaxf(s[row_tile][n][2], s[row_tile][n][3]));
            }
            float alpha[2], max_offset[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                m_new[r] = fmaxf(m_new[r], __shfl_xor_sync(FULL_MASK, m_new[r], 1));
                m_new[r] = fmaxf(m_new[r], __shfl_xor_sync(FULL_MASK, m_new[r], 2));
                // A row with no visible key yet keeps max -inf: use 0, so no inf - inf.
                max_offset[r] = m_new[r] == -INFINITY ? 0.0f : m_new[r] * scale_log2;
                alpha[r] = fast_exp2(m[row_tile][r] * scale_log2 - max_offset[r]);
                m[row_tile][r] = m_new[r];
                l[row_tile][r] *= alpha[r];
            }

            // P = exp(scale * (S - m)), rounded to bf16 and packed as the A operand of
            // O += P V: the accumulators of two neighbouring 8-key tiles are exactly the A
            // fragment of one 16-key k-step (tile 2k: registers 0, 1; 2k+1: 2, 3).
#pragma unroll
            for (int n = 0; n < S_TILES; ++n) {
                const float p0 = fast_exp2(fmaf(s[row_tile][n][0], scale_log2, -max_offset[0]));
                const float p1 = fast_exp2(fmaf(s[row_tile][n][1], scale_log2, -max_offset[0]));
                const float p2 = fast_exp2(fmaf(s[row_tile][n][2], scale_log2, -max_offset[1]));
                const float p3 = fast_exp2(fmaf(s[row_tile][n][3], scale_log2, -max_offset[1]));
                l[row_tile][0] += p0 + p1;
                l[row_tile][1] += p2 + p3;
                p_fragment[row_tile][n / 2][(n % 2) * 2 + 0] = pack_bf16x2(p0, p1);
                p_fragment[row_tile][n / 2][(n % 2) * 2 + 1] = pack_bf16x2(p2, p3);
            }

            // Once the running max has settled most tiles leave it unchanged (alpha = 1
            // exactly): the multiplies may be skipped when that holds for every row of the warp.
            if (!Config::SKIP_UNCHANGED_RESCALE ||
                __any_sync(FULL_MASK, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
                for (int d = 0; d < O_TILES; ++d) {
                    o[row_tile][d][0] *= alpha[0];
                    o[row_tile][d][1] *= alpha[0];
                    o[row_tile][d][2] *= alpha[1];
                    o[row_tile][d][3] *= alpha[1];
                }
            }
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
                for (int row_tile = 0; row_tile < ROW_TILES; ++row_tile) {
                    mma_m16n8k16_bf16(o[row_tile][d], p_fragment[row_tile][step], b[0], b[1]);
                    mma_m16n8k16_bf16(o[row_tile][d + 1], p_fragment[row_tile][step], b[2], b[3]);
                }
            }
        }
        const uint32_t k_flip = kv_tile % 2 == 0 ? K_TILE_BYTES : 0u - K_TILE_BYTES;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            k_base[c] += k_flip;
            v_base[c] += k_flip;  // V tiles: same size
        }
    }
    // Finish l over the quad, normalize, store the rows that exist. LSE = m * scale + ln(l).
#pragma unroll
    for (int row_tile = 0; row_tile < ROW_TILES; ++row_tile)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float sum = l[row_tile][r];
            sum += __shfl_xor_sync(FULL_MASK, sum, 1);
            sum += __shfl_xor_sync(FULL_MASK, sum, 2);
            const int row = q_start + warp_row + row_tile * 16 + fragment_row + r * 8;
            if (row >= len_q) continue;
            const float inverse_sum = 1.0f / sum;
            bf16* o_row = O + (head * len_q + row) * HEAD_DIM;
#pragma unroll
            for (int d = 0; d < O_TILES; ++d)
                *reinterpret_cast<__nv_bfloat162*>(o_row + d * 8 + fragment_column) =
                    __floats2bfloat162_rn(o[row_tile][d][2 * r] * inverse_sum,
                                          o[row_tile][d][2 * r + 1] * inverse_sum);
            if (lse != nullptr && lane % 4 == 0)
                lse[head * len_q + row] = m[row_tile][r] * scale + logf(sum);
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

// group_heads = 0: heads_per_l2_group; the tuning experiment also times 1 and batch * heads.
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

// ---- forward: end (bench/check_forward_copy.py, run by make docs-check, keeps it 06's) ----

// ---- backward 1: delta = rowsum(dO * O), one warp per row ---------------------------------
constexpr int PRE_THREADS = 256;

template <int HEAD_DIM>
__global__ void __launch_bounds__(PRE_THREADS)
preprocess_kernel(const bf16* __restrict__ O, const bf16* __restrict__ dO,
                  float* __restrict__ delta, int64_t rows) {
    const int lane = threadIdx.x % 32;
    const int64_t warps = int64_t(gridDim.x) * (PRE_THREADS / 32);
    for (int64_t row = int64_t(blockIdx.x) * (PRE_THREADS / 32) + threadIdx.x / 32; row < rows;
         row += warps) {
        const bf16 *o_row = O + row * HEAD_DIM, *do_row = dO + row * HEAD_DIM;
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

// ---- backward 2: dK, dV and dQ in one pass (FlashAttention-2's split) ----------------------
// One block of 8 warps owns 128 keys and walks the query tiles (64 rows at D = 128, 128 at
// D = 64). Each product is split over the warps in the shape that reads least shared memory
// per mma (chapter 07's table); dK and dV stay in registers for the whole walk, dQ goes to an
// FP32 accumulator (by the copy engine on Hopper, by atomics before it).
template <int HEAD_DIM_>
struct OnePassTiles {
    static constexpr int HEAD_DIM = HEAD_DIM_;
    static constexpr int BLOCK_Q = HEAD_DIM == 64 ? 128 : 64, BLOCK_KV = 128;
    static constexpr int WARPS = 8, THREADS = 32 * WARPS;
    static constexpr int Q_WARPS = BLOCK_Q / 32;        // S, dP and dQ: warps along queries
    static constexpr int K_WARPS = WARPS / Q_WARPS;     // ... and along keys (dims for dQ)
    static constexpr int KEY_WARPS = BLOCK_KV / 32;     // dK and dV: warps along keys
    static constexpr int DIM_WARPS = WARPS / KEY_WARPS;  // ... and along the head dim
    static_assert(Q_WARPS * K_WARPS == WARPS && KEY_WARPS * DIM_WARPS == WARPS, "warp grids");
    static constexpr int KV_TILE = BLOCK_KV * HEAD_DIM, Q_TILE = BLOCK_Q * HEAD_DIM;
    static constexpr int SCORE_TILE = BLOCK_Q * BLOCK_KV;
    // Q and dO arrive Q_STAGES - 1 tiles ahead: three stages on Hopper, two on older GPUs.
    static constexpr int HOPPER_Q_STAGES = 3, OLDER_Q_STAGES = 2;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    static constexpr int Q_STAGES = OLDER_Q_STAGES;
#else
    static constexpr int Q_STAGES = HOPPER_Q_STAGES;
#endif
    static_assert(sizeof(float) * K_WARPS * BLOCK_Q <= sizeof(bf16) * SCORE_TILE, "row sums fit");
    // dQ: each warp's 32 queries x DQ_DIMS dims are DQ_FRAGMENTS fragments of 4 floats per
    // lane, kept in that order in the accumulator, one chunk of BLOCK_Q x HEAD_DIM floats per
    // (head, query tile), [warp][fragment][lane][4]: a warp's share is consecutive.
    static constexpr int DQ_DIMS = HEAD_DIM / K_WARPS, DQ_D_TILES = DQ_DIMS / 8;
    static constexpr int DQ_FRAGMENTS = 2 * DQ_D_TILES, DQ_WARP_FLOATS = DQ_FRAGMENTS * 32 * 4;
    static_assert(DQ_WARP_FLOATS * WARPS == Q_TILE, "the warps' dQ shares tile the chunk");
    // K, V; Q_STAGES of Q and dO; P and dS; LSE and delta, two buffers each; on Hopper one
    // FP32 Q tile more, where dQ waits for the copy engine. At D = 128: 225 KiB on Hopper, 161
    // before.
    static constexpr size_t shared_bytes(bool hopper) {
        return sizeof(bf16) * (2 * size_t(KV_TILE) +
                               2 * size_t(hopper ? HOPPER_Q_STAGES : OLDER_Q_STAGES) * Q_TILE +
                               2 * size_t(SCORE_TILE)) +
               sizeof(float) * 4 * BLOCK_Q + (hopper ? sizeof(float) * size_t(Q_TILE) : 0);
    }
};

// One thread's view of the one-pass kernel: the shared tiles, where its warp works in each
// product (S and dP: queries s_q.., keys s_k..; dK and dV: keys kv_k.., dims kv_d..; dQ:
// queries s_q.., dims dq_d..), and one function per step of a query tile. A lane holds
// fragment rows fragment_row and + 8, columns fragment_column and + 1.
template <class Tiles>
struct OnePass {
    static constexpr int HEAD_DIM = Tiles::HEAD_DIM;
    using Layout = Tile<HEAD_DIM>;
    using ScoreTile = Tile<Tiles::BLOCK_KV>;  // P and dS: one row of BLOCK_KV keys per query
    static constexpr int BLOCK_Q = Tiles::BLOCK_Q, BLOCK_KV = Tiles::BLOCK_KV, Q_STAGES = Tiles::Q_STAGES;
    static constexpr int Q_WARPS = Tiles::Q_WARPS, K_WARPS = Tiles::K_WARPS;
    static constexpr int S_KEYS = BLOCK_KV / K_WARPS, S_TILES = S_KEYS / 8;  // S and dP, per warp
    // k-steps of S and dP (over the head dim), of dV and dK (the queries), of dQ (the keys)
    static constexpr int QK_STEPS = HEAD_DIM / 16, Q_STEPS = BLOCK_Q / 16, KV_STEPS = BLOCK_KV / 16;
    static constexpr int KV_DIMS = HEAD_DIM / Tiles::DIM_WARPS;  // dims of dK and dV per warp
    static constexpr int KV_D_TILES = KV_DIMS / 8, DQ_D_TILES = Tiles::DQ_D_TILES;
    using Scores = float[2][S_TILES][4];          // this warp's S, P, dP or dS
    using KeyGradient = float[2][KV_D_TILES][4];  // this warp's dK or dV

    bf16 *k_tile, *v_tile, *q_tiles, *do_tiles;  // Q_STAGES buffers each of Q and dO
    bf16 *p_tile, *ds_tile;                      // [query][key]
    float *lse_log2, *delta_tiles;               // two buffers each
    float* warp_sums;  // [K_WARPS][BLOCK_Q] for the exact delta, in P's space while P is unused
    float* dq_stage;   // Hopper: this warp's dQ on its way to the accumulator
    int warp, lane, fragment_row, fragment_column, s_q, s_k, kv_k, kv_d, dq_d;
    __device__ __forceinline__ explicit OnePass(unsigned char* shared) {
        k_tile = reinterpret_cast<bf16*>(shared), v_tile = k_tile + Tiles::KV_TILE;
        q_tiles = v_tile + Tiles::KV_TILE, do_tiles = q_tiles + Q_STAGES * Tiles::Q_TILE;
        p_tile = do_tiles + Q_STAGES * Tiles::Q_TILE, ds_tile = p_tile + Tiles::SCORE_TILE;
        lse_log2 = reinterpret_cast<float*>(ds_tile + Tiles::SCORE_TILE);
        delta_tiles = lse_log2 + 2 * BLOCK_Q, warp_sums = reinterpret_cast<float*>(p_tile);
        dq_stage = delta_tiles + 2 * BLOCK_Q + int(threadIdx.x) / 32 * Tiles::DQ_WARP_FLOATS;
        warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        fragment_row = lane / 4, fragment_column = 2 * (lane % 4);
        s_q = (warp % Q_WARPS) * 32, s_k = (warp / Q_WARPS) * S_KEYS;
        kv_k = (warp / Tiles::DIM_WARPS) * 32, kv_d = (warp % Tiles::DIM_WARPS) * KV_DIMS;
        dq_d = (warp / Q_WARPS) * Tiles::DQ_DIMS;
    }
    // S = Q K^T and dP = dO V^T, this warp's 32 x S_KEYS of each.
    __device__ __forceinline__ void scores(Scores& s, Scores& dp, const bf16* q_tile,
                                           const bf16* do_tile) const {
#pragma unroll
        for (int step = 0; step < QK_STEPS; ++step) {
            uint32_t a[2][4], a2[2][4];
#pragma unroll
            for (int row_tile = 0; row_tile < 2; ++row_tile) {
                load_a<Layout>(a[row_tile], q_tile, s_q + row_tile * 16, step * 16, lane);
                load_a<Layout>(a2[row_tile], do_tile, s_q + row_tile * 16, step * 16, lane);
            }
#pragma unroll
            for (int np = 0; np < S_TILES / 2; ++np) {
                uint32_t b[4];
                load_b<Layout>(b, k_tile, s_k + np * 16, step * 16, lane);
#pragma unroll
                for (int row_tile = 0; row_tile < 2; ++row_tile)
                    mma_two_tiles(s[row_tile], 2 * np, a[row_tile], b);
                load_b<Layout>(b, v_tile, s_k + np * 16, step * 16, lane);
#pragma unroll
                for (int row_tile = 0; row_tile < 2; ++row_tile)
                    mma_two_tiles(dp[row_tile], 2 * np, a2[row_tile], b);
            }
        }
    }

    // S becomes P = exp2(S scale log2e - LSE log2e): the forward's m and l, through its LSE.
    // Masked: keys past len_kv, and (causal) keys after the query.
    __device__ __forceinline__ void probabilities(Scores& s, const float* tile_lse, int q_start,
                                                  int kv_start, int len_kv, float scale_log2,
                                                  bool causal) const {
        const bool needs_mask =
            kv_start + BLOCK_KV > len_kv || (causal && kv_start + BLOCK_KV - 1 > q_start);
#pragma unroll
        for (int row_tile = 0; row_tile < 2; ++row_tile)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = s_q + row_tile * 16 + fragment_row + r * 8;
                const float row_lse = tile_lse[row];
#pragma unroll
                for (int n = 0; n < S_TILES; ++n)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        float p = fast_exp2(s[row_tile][n][2 * r + c] * scale_log2 - row_lse);
                        if (needs_mask) {
                            const int key = kv_start + s_k + n * 8 + fragment_column + c;
                            if (key >= len_kv || (causal && key > q_start + row)) p = 0.0f;
                        }
                        s[row_tile][n][2 * r + c] = p;
                    }
            }
    }

    // When one block holds every key it sees whole rows of P and dP, and delta = rowsum(P * dP)
    // exactly: row sums over this warp's keys, then over the K_WARPS key groups, into
    // tile_delta.
    __device__ __forceinline__ void exact_delta(const Scores& p, const Scores& dp,
                                                float* tile_delta) const {
#pragma unroll
        for (int row_tile = 0; row_tile < 2; ++row_tile)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float sum = 0.0f;
#pragma unroll
                for (int n = 0; n < S_TILES; ++n)
                    sum += p[row_tile][n][2 * r] * dp[row_tile][n][2 * r] +
                           p[row_tile][n][2 * r + 1] * dp[row_tile][n][2 * r + 1];
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                const int row = s_q + row_tile * 16 + fragment_row + r * 8;
                if (fragment_column == 0) warp_sums[(warp / Q_WARPS) * BLOCK_Q + row] = sum;
            }
        __syncthreads();
        if (int(threadIdx.x) < BLOCK_Q) {
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < K_WARPS; ++w) sum += warp_sums[w * BLOCK_Q + threadIdx.x];
            tile_delta[threadIdx.x] = sum;
        }
        __syncthreads();
    }

    // excerpt: ds
    // dP becomes dS = P (dP - delta); its scale is applied once, to dK and dQ at the end. P
    // and dS go to shared memory as bf16; ds_sums gets rowsum(dS) over this warp's keys, which
    // goes to the workspace with the tile's dQ, for the centred dQ.
    __device__ __forceinline__ void score_gradients(const Scores& p, Scores& dp,
                                                    float (&ds_sums)[2][2],
                                                    const float* tile_delta) const {
#pragma unroll
        for (int row_tile = 0; row_tile < 2; ++row_tile)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = s_q + row_tile * 16 + fragment_row + r * 8;
                const float row_delta = tile_delta[row];
                float& sum = ds_sums[row_tile][r];
                sum = 0.0f;
#pragma unroll
                for (int n = 0; n < S_TILES; ++n) {
                    const float* p_pair = &p[row_tile][n][2 * r];
                    float* ds = &dp[row_tile][n][2 * r];
                    ds[0] = p_pair[0] * (ds[0] - row_delta);
                    ds[1] = p_pair[1] * (ds[1] - row_delta);
                    sum += ds[0] + ds[1];
                    const int column = s_k + n * 8 + fragment_column;
                    store_bf16x2(p_tile + ScoreTile::offset(row, column), p_pair[0], p_pair[1]);
                    store_bf16x2(ds_tile + ScoreTile::offset(row, column), ds[0], ds[1]);
                }
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            }
    }
    // end excerpt

    // gradient += A^T B over the tile's queries, A^T read transposed from a score tile:
    // dV += P^T dO (A = P, B = dO) or dK += dS^T Q (A = dS, B = Q).
    __device__ __forceinline__ void key_gradient(KeyGradient& gradient, const bf16* score_tile,
                                                 const bf16* b_tile) const {
#pragma unroll
        for (int step = 0; step < Q_STEPS; ++step) {
            uint32_t a[2][4];
#pragma unroll
            for (int row_tile = 0; row_tile < 2; ++row_tile)
                load_a_transposed<ScoreTile>(a[row_tile], score_tile, kv_k + row_tile * 16,
                                             step * 16, lane);
#pragma unroll
            for (int np = 0; np < KV_D_TILES / 2; ++np) {
                uint32_t b[4];
                load_b_transposed<Layout>(b, b_tile, kv_d + np * 16, step * 16, lane);
#pragma unroll
                for (int row_tile = 0; row_tile < 2; ++row_tile)
                    mma_two_tiles(gradient[row_tile], 2 * np, a[row_tile], b);
            }
        }
    }

    // dQ(tile) += dS K over this block's keys, added to the FP32 accumulator; rowsum(dS) to
    // ds_rowsum.
    __device__ __forceinline__ void query_gradient(float* dq_accum, float* ds_rowsum,
                                                   const float (&ds_sums)[2][2], int64_t head,
                                                   int tile, int q_tile_count, int len_q) const {
        float dq[2][DQ_D_TILES][4] = {};
#pragma unroll
        for (int step = 0; step < KV_STEPS; ++step) {
            uint32_t a[2][4];
#pragma unroll
            for (int row_tile = 0; row_tile < 2; ++row_tile)
                load_a<ScoreTile>(a[row_tile], ds_tile, s_q + row_tile * 16, step * 16, lane);
#pragma unroll
            for (int np = 0; np < DQ_D_TILES / 2; ++np) {
                uint32_t b[4];
                load_b_transposed<Layout>(b, k_tile, dq_d + np * 16, step * 16, lane);
#pragma unroll
                for (int row_tile = 0; row_tile < 2; ++row_tile)
                    mma_two_tiles(dq[row_tile], 2 * np, a[row_tile], b);
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
        for (int row_tile = 0; row_tile < 2; ++row_tile)
#pragma unroll
            for (int n = 0; n < DQ_D_TILES; ++n)
                *reinterpret_cast<float4*>(dq_stage + ((row_tile * DQ_D_TILES + n) * 32 + lane) * 4) =
                    make_float4(dq[row_tile][n][0], dq[row_tile][n][1], dq[row_tile][n][2],
                                dq[row_tile][n][3]);
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
        for (int row_tile = 0; row_tile < 2; ++row_tile)
#pragma unroll
            for (int n = 0; n < DQ_D_TILES; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    atomicAdd(dq_share + ((row_tile * DQ_D_TILES + n) * 32 + lane) * 4 + i,
                              dq[row_tile][n][i]);
#endif
        // end excerpt
        // After the hand-over above: its fence would otherwise wait for these atomics.
#pragma unroll
        for (int row_tile = 0; row_tile < 2; ++row_tile)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = tile * BLOCK_Q + s_q + row_tile * 16 + fragment_row + r * 8;
                if (fragment_column == 0 && row < len_q)
                    atomicAdd(ds_rowsum + head * len_q + row, ds_sums[row_tile][r]);
            }
    }

    // dK (scaled) and dV to bf16. Keys past the end are not stored; keys no query sees
    // (causal) get exact zeros.
    __device__ __forceinline__ void store_key_gradients(const KeyGradient& dk,
                                                        const KeyGradient& dv, bf16* dK, bf16* dV,
                                                        int64_t head, int kv_start, int len_kv,
                                                        float scale) const {
#pragma unroll
        for (int row_tile = 0; row_tile < 2; ++row_tile)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int key = kv_start + kv_k + row_tile * 16 + fragment_row + r * 8;
                if (key >= len_kv) continue;
                const int64_t offset = (head * len_kv + key) * HEAD_DIM + kv_d;
                bf16 *dk_row = dK + offset, *dv_row = dV + offset;
#pragma unroll
                for (int n = 0; n < KV_D_TILES; ++n) {
                    store_bf16x2(dk_row + n * 8 + fragment_column, dk[row_tile][n][2 * r] * scale,
                                 dk[row_tile][n][2 * r + 1] * scale);
                    store_bf16x2(dv_row + n * 8 + fragment_column, dv[row_tile][n][2 * r],
                                 dv[row_tile][n][2 * r + 1]);
                }
            }
    }
};

template <class Tiles>
__global__ void __launch_bounds__(Tiles::THREADS, 1)
one_pass_backward_kernel(const bf16* __restrict__ Q, const bf16* __restrict__ K,
                         const bf16* __restrict__ V, const bf16* __restrict__ dO,
                         const float* __restrict__ lse, const float* __restrict__ delta,
                         bf16* __restrict__ dK, bf16* __restrict__ dV,
                         float* __restrict__ dq_accum, float* __restrict__ ds_rowsum, int len_q,
                         int len_kv, int kv_blocks, float scale, bool causal) {
    constexpr int HEAD_DIM = Tiles::HEAD_DIM, THREADS = Tiles::THREADS;
    constexpr int BLOCK_Q = Tiles::BLOCK_Q, BLOCK_KV = Tiles::BLOCK_KV, Q_STAGES = Tiles::Q_STAGES;
    const float scale_log2 = scale * LOG2E;
    extern __shared__ __align__(128) unsigned char shared_raw[];
    const OnePass<Tiles> step(shared_raw);

    // Heads are the slow index, so the blocks in flight share the Q, dO and dQ of few heads.
    const int64_t head = int(blockIdx.x) / kv_blocks;
    const int kv_start = (int(blockIdx.x) % kv_blocks) * BLOCK_KV;
    const bf16 *q_head = Q + head * len_q * HEAD_DIM, *do_head = dO + head * len_q * HEAD_DIM;
    const float *lse_head = lse + head * len_q, *delta_head = delta + head * len_q;
    // One block holding every key sees whole rows of P and dP: delta = rowsum(P * dP) exactly.
    const bool delta_is_exact = kv_blocks == 1;
    typename OnePass<Tiles>::KeyGradient dk = {}, dv = {};
    // Causal: queries before kv_start see none of these keys; skip their tiles.
    const int q_tile_count = ceil_div(len_q, BLOCK_Q);
    const int first_tile = causal ? kv_start / BLOCK_Q : 0;

    // LSE (in the exp2 domain) and delta of one query tile, one row per thread of the first
    // BLOCK_Q: loaded into registers a tile ahead and stored to shared memory once this tile's
    // work is done, so that no warp waits for them. Rows past the end get LSE = +inf, so that
    // their P is exactly 0 and they add nothing to dK or dV.
    static_assert(BLOCK_Q <= THREADS, "one row per thread");
    const bool stats_thread = int(threadIdx.x) < BLOCK_Q;
    float next_lse = INFINITY, next_delta = 0.0f;
    auto load_row_stats = [&](int tile) {
        const int row = tile * BLOCK_Q + int(threadIdx.x);
        const bool inside = stats_thread && row < len_q;
        next_lse = inside ? lse_head[row] : INFINITY;
        next_delta = inside ? delta_head[row] : 0.0f;
    };
    auto store_row_stats = [&](int buffer) {
        if (stats_thread) {
            step.lse_log2[buffer * BLOCK_Q + threadIdx.x] = next_lse * LOG2E;
            step.delta_tiles[buffer * BLOCK_Q + threadIdx.x] = next_delta;
        }
    };
    // Q and dO of a query tile into stage `stage`, as one cp.async group (an empty group past
    // the last tile, so that every tile accounts for exactly one group).
    auto load_query_tile = [&](int tile, int stage) {
        if (tile < q_tile_count) {
            const int offset = stage * Tiles::Q_TILE, row = tile * BLOCK_Q;
            load_tile<BLOCK_Q, HEAD_DIM, THREADS>(step.q_tiles + offset, q_head, row, len_q);
            load_tile<BLOCK_Q, HEAD_DIM, THREADS>(step.do_tiles + offset, do_head, row, len_q);
        }
        cp_async_commit();
    };

    if (first_tile < q_tile_count) {
        load_tile<BLOCK_KV, HEAD_DIM, THREADS>(step.k_tile, K + head * len_kv * HEAD_DIM, kv_start, len_kv);
        load_tile<BLOCK_KV, HEAD_DIM, THREADS>(step.v_tile, V + head * len_kv * HEAD_DIM, kv_start, len_kv);
        load_query_tile(first_tile, 0);  // the first group: K, V and the first Q and dO
        for (int ahead = 1; ahead < Q_STAGES - 1; ++ahead) load_query_tile(first_tile + ahead, ahead);
        load_row_stats(first_tile);
        store_row_stats(0);
    }

    // excerpt: loop-top
    int stage = 0;  // (tile - first_tile) % Q_STAGES
    for (int tile = first_tile; tile < q_tile_count; ++tile) {
        const int buffer = (tile - first_tile) % 2;  // of LSE and delta
        // This tile's Q and dO have landed (the Q_STAGES - 2 newer groups may still be in
        // flight); the barrier also tells that every warp is done with the last tile, so its
        // stage, P and dS may be rewritten.
        cp_async_wait<Q_STAGES - 2>();
        __syncthreads();
        load_query_tile(tile + Q_STAGES - 1, stage == 0 ? Q_STAGES - 1 : stage - 1);
        if (tile + 1 < q_tile_count) load_row_stats(tile + 1);
        const bf16* q_tile = step.q_tiles + stage * Tiles::Q_TILE;
        const bf16* do_tile = step.do_tiles + stage * Tiles::Q_TILE;
        stage = stage == Q_STAGES - 1 ? 0 : stage + 1;
        const float* tile_lse = step.lse_log2 + buffer * BLOCK_Q;
        float* tile_delta = step.delta_tiles + buffer * BLOCK_Q;
        const int q_start = tile * BLOCK_Q;
    // end excerpt

        typename OnePass<Tiles>::Scores s = {}, dp = {};
        step.scores(s, dp, q_tile, do_tile);
        step.probabilities(s, tile_lse, q_start, kv_start, len_kv, scale_log2, causal);
        if (delta_is_exact) step.exact_delta(s, dp, tile_delta);
        float ds_sums[2][2];
        step.score_gradients(s, dp, ds_sums, tile_delta);
        __syncthreads();  // P and dS are complete

        // excerpt: product-order
        // dV first (its P tile is read by nothing else), then dQ, whose hand-over to the copy
        // engine leaves while the warp still has dK's mma to issue, then dK.
        step.key_gradient(dv, step.p_tile, do_tile);
        step.query_gradient(dq_accum, ds_rowsum, ds_sums, head, tile, q_tile_count, len_q);
        step.key_gradient(dk, step.ds_tile, q_tile);
        if (tile + 1 < q_tile_count) store_row_stats(1 - buffer);
        // end excerpt
    }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (step.lane == 0) bulk_wait<0>();  // the stage must outlive the copy engine's reads
#endif
    step.store_key_gradients(dk, dv, dK, dV, head, kv_start, len_kv, scale);
}

// ---- backward 3: the FP32 dQ accumulator, centred, scaled, to bf16 ------------------------
// dQ_i = scale sum_j dS_ij (K_j - c) for any c, since sum_j dS_ij = 0 in exact arithmetic; with
// delta from the bf16 O it is not, and c = mean(K) keeps K's common part from multiplying that
// error (chapter 07, Precision): this subtracts (sum_j dS_ij) mean(K). The accumulator is in
// the one-pass kernel's order: a thread takes one lane's 4 floats of a fragment (2 dims, 2 rows).
template <class Tiles>
__global__ void convert_dq_kernel(const float* __restrict__ dq_accum, const float* __restrict__ ds_rowsum,
                                  const float* __restrict__ key_sum, bf16* __restrict__ dQ, int64_t fragments,
                                  int len_q, int q_tiles, float inverse_len_kv, float scale) {
    constexpr int HEAD_DIM = Tiles::HEAD_DIM, CHUNK_FRAGMENTS = Tiles::Q_TILE / 4;  // float4s per tile
    for (int64_t f = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; f < fragments;
         f += int64_t(gridDim.x) * blockDim.x) {
        const int64_t chunk = f / CHUNK_FRAGMENTS;
        const int within = int(f % CHUNK_FRAGMENTS);
        const int warp = within / (Tiles::DQ_FRAGMENTS * 32), lane = within % 32;
        const int fragment = within / 32 % Tiles::DQ_FRAGMENTS;
        const int row_tile = fragment / Tiles::DQ_D_TILES, n = fragment % Tiles::DQ_D_TILES;
        const int64_t head = chunk / q_tiles;
        const int row = int(chunk % q_tiles) * Tiles::BLOCK_Q + (warp % Tiles::Q_WARPS) * 32 +
                        row_tile * 16 + lane / 4;
        const int d = (warp / Tiles::Q_WARPS) * Tiles::DQ_DIMS + n * 8 + 2 * (lane % 4);
        const float4 value = reinterpret_cast<const float4*>(dq_accum)[f];
        const float2 sums = *reinterpret_cast<const float2*>(key_sum + head * HEAD_DIM + d);
        // rowsum(dS) * mean(K) = (rowsum(dS) / len_kv) * sum(K), for rows row and row + 8
        const float pair[2][2] = {{value.x, value.y}, {value.z, value.w}};
        for (int r = 0; r < 2; ++r) {
            if (row + 8 * r >= len_q) break;
            const float weight = ds_rowsum[head * len_q + row + 8 * r] * inverse_len_kv;
            store_bf16x2(dQ + (head * len_q + row + 8 * r) * HEAD_DIM + d,
                         (pair[r][0] - weight * sums.x) * scale, (pair[r][1] - weight * sums.y) * scale);
        }
    }
}

// Column sums of K per (batch, head), for the centred dQ: a block sums one column over 64
// keys and adds it in (in no fixed order, like dQ itself).
constexpr int KEY_SUM_ROWS = 64;

template <int HEAD_DIM>
__global__ void __launch_bounds__(HEAD_DIM)
key_sum_kernel(const bf16* __restrict__ K, float* __restrict__ key_sum, int len_kv) {
    const int64_t head = blockIdx.x;
    const int begin = blockIdx.y * KEY_SUM_ROWS, end = min(len_kv, begin + KEY_SUM_ROWS);
    const bf16* column = K + head * len_kv * HEAD_DIM + threadIdx.x;
    float sum = 0.0f;
    for (int j = begin; j < end; ++j) sum += __bfloat162float(column[int64_t(j) * HEAD_DIM]);
    atomicAdd(key_sum + head * HEAD_DIM + threadIdx.x, sum);
}

// ---- launchers ------------------------------------------------------------------------------
// key_sum_kernel puts the 64-key slice in gridDim.y (at most 65535): 2^20 keeps it there.
constexpr int MAX_LENGTH = 1 << 20;

// The workspace: delta per query row, then what is summed into and so starts at zero:
// rowsum(dS) per query row, the column sums of K per head, the FP32 dQ accumulator (whole query
// tiles of the one-pass kernel, the last one padded).
struct WorkspaceLayout {
    size_t delta = 0, ds_rowsum = 0, key_sum = 0, dq_accum = 0, total = 0;
    explicit WorkspaceLayout(const AttentionShape& shape) {
        auto rounded = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
        const size_t row_bytes = rounded(size_t(shape.lse_elements()) * sizeof(float));
        ds_rowsum = row_bytes, key_sum = 2 * row_bytes;
        const size_t heads = size_t(shape.batch) * shape.heads;
        dq_accum = key_sum + rounded(heads * shape.head_dim * sizeof(float));
        const int block_q = shape.head_dim == 64 ? OnePassTiles<64>::BLOCK_Q : OnePassTiles<128>::BLOCK_Q;
        const size_t accum_rows = heads * size_t(ceil_div(shape.len_q, block_q)) * block_q;
        total = dq_accum + accum_rows * shape.head_dim * sizeof(float);
    }
};

// The grids' limits, checked with the rest of the validation, before anything is allocated
// or launched: the one-pass grid has one block per (head, key tile) in x.
void validate_backward_grids(const AttentionShape& shape) {
    const int kv_blocks = ceil_div(shape.len_kv, OnePassTiles<64>::BLOCK_KV);
    static_assert(OnePassTiles<64>::BLOCK_KV == OnePassTiles<128>::BLOCK_KV, "one key tile");
    const int64_t blocks = int64_t(shape.batch) * shape.heads * kv_blocks;
    if (blocks > INT_MAX)
        throw std::invalid_argument("attention_backward: batch * heads * ceil(len_kv / " +
                                    std::to_string(OnePassTiles<64>::BLOCK_KV) + ") = " + std::to_string(blocks) +
                                    " is not allowed: must be at most 2^31 - 1");
}

template <int HEAD_DIM>
void launch_backward(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const float* lse,
                     const bf16* dout, bf16* dq, bf16* dk, bf16* dv, const AttentionShape& shape,
                     cudaStream_t stream) {
    using Tiles = OnePassTiles<HEAD_DIM>;
    const WorkspaceLayout layout(shape);
    Workspace workspace(layout.total, stream);  // refuses, before any launch, what cannot fit
    char* base = workspace.as<char>();
    auto at = [base](size_t offset) { return reinterpret_cast<float*>(base + offset); };
    float *delta = at(layout.delta), *ds_rowsum = at(layout.ds_rowsum);
    float *key_sum = at(layout.key_sum), *dq_accum = at(layout.dq_accum);
    const float scale = shape.softmax_scale();
    const unsigned heads = unsigned(shape.batch * shape.heads);
    const int64_t rows = shape.lse_elements();

    CUDA_CHECK(cudaMemsetAsync(ds_rowsum, 0, layout.total - layout.ds_rowsum, stream));
    const int pre_blocks = int(std::min<int64_t>((rows + 7) / 8, 65536));
    preprocess_kernel<HEAD_DIM><<<pre_blocks, PRE_THREADS, 0, stream>>>(o, dout, delta, rows);
    CUDA_CHECK(cudaGetLastError());
    key_sum_kernel<HEAD_DIM><<<dim3(heads, unsigned(ceil_div(shape.len_kv, KEY_SUM_ROWS))), HEAD_DIM,
                               0, stream>>>(k, key_sum, shape.len_kv);
    CUDA_CHECK(cudaGetLastError());

    int device = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    // Hopper and later: the kernel's sm_90 path (three Q stages, dQ staged for the copy engine).
    const size_t bytes = Tiles::shared_bytes(major >= 9);
    CUDA_CHECK(cudaFuncSetAttribute(one_pass_backward_kernel<Tiles>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    const int kv_blocks = ceil_div(shape.len_kv, Tiles::BLOCK_KV);
    one_pass_backward_kernel<Tiles><<<heads * unsigned(kv_blocks), Tiles::THREADS, bytes, stream>>>(
        q, k, v, dout, lse, delta, dk, dv, dq_accum, ds_rowsum, shape.len_q, shape.len_kv,
        kv_blocks, scale, shape.causal);
    CUDA_CHECK(cudaGetLastError());
    const int64_t fragments = int64_t((layout.total - layout.dq_accum) / (4 * sizeof(float)));
    const int convert_blocks = int(std::min<int64_t>((fragments + 255) / 256, 65536));
    convert_dq_kernel<Tiles><<<convert_blocks, 256, 0, stream>>>(
        dq_accum, ds_rowsum, key_sum, dq, fragments, shape.len_q,
        ceil_div(shape.len_q, Tiles::BLOCK_Q), 1.0f / float(shape.len_kv), scale);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace

const StageCapabilities& stage_capabilities() {
    // 16-byte alignment: every cp.async moves 16 bytes. No deterministic backward
    // (deterministic_backward stays false, so validate_backward refuses deterministic = true):
    // the blocks add their dQ, their warps the dS row sums, and key_sum_kernel's blocks the K
    // column sums into device memory in no fixed order. Stage 11 orders its sums.
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
    return WorkspaceLayout(shape).total;
}

void attention_backward(const bf16* q, const bf16* k, const bf16* v, const bf16* o,
                        const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv,
                        const AttentionShape& shape, cudaStream_t stream, const float* key_centre) {
    // Everything before anything is allocated or launched: the shape, then the grid it needs,
    // then the pointers. A key_centre is refused there (key_centre_backward stays false: the
    // convert kernel takes c from key_sum_kernel's sums of the call's keys).
    validate_shape(shape, stage_capabilities());
    validate_backward_grids(shape);
    validate_backward(shape, stage_capabilities(), q, k, v, o, lse, dout, dq, dk, dv, key_centre);
    if (shape.head_dim == 64)
        launch_backward<64>(q, k, v, o, lse, dout, dq, dk, dv, shape, stream);
    else
        launch_backward<128>(q, k, v, o, lse, dout, dq, dk, dv, shape, stream);
}
