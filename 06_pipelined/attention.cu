// Stage 06: stage 05 with its memory traffic overlapped with its math. K and V are double-
// buffered: while the warps work on tile j, the cp.async copies of tile j+1 are in flight
// (commit/wait groups), so the block waits only where data is really needed, at one barrier per
// tile. ldmatrix.x4 loads two mma B operands at once for K and V, each warp owns two 16-row mma
// tiles so that every fragment it loads feeds two mma, and the tiling is a template parameter
// tuned per head dim for the H100 (bench/experiments/tune_06.cu times the alternatives).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "attention.h"
#include "cuda_check.h"
#include "ptx.cuh"
#include "swizzle.h"
#include "validate.h"

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

    // excerpt: pipeline
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
        // end excerpt

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
        // excerpt: buffer-flip
        const uint32_t k_flip = kv_tile % 2 == 0 ? K_TILE_BYTES : 0u - K_TILE_BYTES;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            k_base[c] += k_flip;
            v_base[c] += k_flip;  // V tiles: same size
        }
    }
        // end excerpt

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

}  // namespace

constexpr int MAX_LENGTH = 1 << 30;  // keeps every tile index inside int

const StageCapabilities& stage_capabilities() {
    // 16-byte alignment: every cp.async moves 16 bytes.
    static const StageCapabilities caps{"06_pipelined", "bf16", {64, 128}, MAX_LENGTH,
                                        MAX_LENGTH, true, false, 16};
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
