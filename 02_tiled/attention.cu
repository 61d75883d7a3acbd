// Stage 02: a block per tile of BLOCK_Q queries, K and V staged through shared memory in tiles.
// Stage 01 gave every query row its own block, so every row read all of K and V from device
// memory again. Here BLOCK_Q rows share each K and V tile that the block loads once, and no
// row of N scores exists anywhere: the softmax takes two passes over the KV tiles, the first
// for the row max m and sum l, the second recomputing the scores to accumulate P V / l.
#include <algorithm>
#include <climits>
#include <cmath>

#include "attention.h"
#include "cuda_check.h"
#include "validate.h"

namespace {

constexpr int BLOCK_Q = 64;   // query rows per block: each K/V tile is reused this many times
constexpr int BLOCK_KV = 32;  // keys per tile: one warp covers a row of scores
constexpr int THREADS = 128;
// Query tiles and batch x heads index the grid; a tile start must not overflow an int.
constexpr int MAX_LENGTH = INT_MAX - BLOCK_Q;

// Shared memory, in floats. The transposed K tile and the score tile get one extra column so
// that a warp walking down a column (the transposing store, the per-row softmax) touches 32
// different banks instead of one.
template <int HEAD_DIM>
struct SharedLayout {
    static constexpr int Q = 0;                                      // [BLOCK_Q][HEAD_DIM]
    static constexpr int K_T = Q + BLOCK_Q * HEAD_DIM;               // [HEAD_DIM][BLOCK_KV + 1]
    static constexpr int V = K_T + HEAD_DIM * (BLOCK_KV + 1);        // [BLOCK_KV][HEAD_DIM]
    static constexpr int S = V + BLOCK_KV * HEAD_DIM;                // [BLOCK_Q][BLOCK_KV + 1]
    static constexpr int M = S + BLOCK_Q * (BLOCK_KV + 1);           // [BLOCK_Q]
    static constexpr int L = M + BLOCK_Q;                            // [BLOCK_Q]
    static constexpr int FLOATS = L + BLOCK_Q;
    static constexpr size_t BYTES = sizeof(float) * FLOATS;
};

// Rows past the end of the sequence load as zeros: never read out of bounds, and a zero V row
// times a zero probability stays zero.
template <int ROWS, int HEAD_DIM>
__device__ void load_rows(float* tile, const float* source, int rows_left) {
    for (int index = threadIdx.x; index < ROWS * HEAD_DIM; index += THREADS) {
        const int row = index / HEAD_DIM;
        const int d = index % HEAD_DIM;
        tile[index] = row < rows_left ? source[int64_t(row) * HEAD_DIM + d] : 0.0f;
    }
}

// Consecutive threads read consecutive elements of a K row (coalesced) and write them down a
// column of the transposed tile, so that the score loop reads consecutive keys.
template <int HEAD_DIM>
__device__ void load_k_transposed(float* k_t, const float* K, int rows_left) {
    for (int index = threadIdx.x; index < BLOCK_KV * HEAD_DIM; index += THREADS) {
        const int row = index / HEAD_DIM;
        const int d = index % HEAD_DIM;
        k_t[d * (BLOCK_KV + 1) + row] = row < rows_left ? K[int64_t(row) * HEAD_DIM + d] : 0.0f;
    }
}

// S = scale * Q K^T for one tile, masked: keys past the end and, when causal, keys after the
// query get -inf, so that exp() turns them into probability 0.
template <int HEAD_DIM>
__device__ void tile_scores(float* s, const float* q_tile, const float* k_t, int q_start,
                            int kv_start, int len_kv, float scale, bool causal) {
    for (int index = threadIdx.x; index < BLOCK_Q * BLOCK_KV; index += THREADS) {
        const int row = index / BLOCK_KV;
        const int col = index % BLOCK_KV;  // a warp spans one row: Q is a broadcast
        float dot = 0.0f;
#pragma unroll 16
        for (int d = 0; d < HEAD_DIM; ++d)
            dot += q_tile[row * HEAD_DIM + d] * k_t[d * (BLOCK_KV + 1) + col];
        const int i = q_start + row, j = kv_start + col;
        const bool visible = j < len_kv && (!causal || j <= i);
        s[row * (BLOCK_KV + 1) + col] = visible ? dot * scale : -INFINITY;
    }
}

template <int HEAD_DIM>
__global__ void __launch_bounds__(THREADS)
tiled_attention_kernel(const float* __restrict__ Q, const float* __restrict__ K,
                       const float* __restrict__ V, float* __restrict__ O, float* __restrict__ lse,
                       int batch_heads, int len_q, int len_kv, float scale, bool causal) {
    using Layout = SharedLayout<HEAD_DIM>;
    extern __shared__ float shared[];
    float* q_tile = shared + Layout::Q;
    float* k_t = shared + Layout::K_T;
    float* v_tile = shared + Layout::V;
    float* s = shared + Layout::S;
    float* row_m = shared + Layout::M;
    float* row_l = shared + Layout::L;

    // Each thread owns OUTPUTS elements of one column d of the O tile, in rows
    // row0 + e * ROW_STEP: a warp reads consecutive elements of a V row, and each V element a
    // thread loads serves all of its OUTPUTS rows.
    static_assert(THREADS % HEAD_DIM == 0, "a thread's outputs share one column");
    constexpr int OUTPUTS = BLOCK_Q * HEAD_DIM / THREADS;
    constexpr int ROW_STEP = THREADS / HEAD_DIM;
    const int d = threadIdx.x % HEAD_DIM, row0 = threadIdx.x / HEAD_DIM;
    const int q_start = blockIdx.x * BLOCK_Q;
    for (int bh = blockIdx.y; bh < batch_heads; bh += gridDim.y) {
        const int64_t q_offset = (int64_t(bh) * len_q + q_start) * HEAD_DIM;
        const int64_t kv_offset = int64_t(bh) * len_kv * HEAD_DIM;
        load_rows<BLOCK_Q, HEAD_DIM>(q_tile, Q + q_offset, len_q - q_start);

        // excerpt: pass-one
        // Pass 1: m and l of every row. Each tile's max may raise m; l then shrinks by
        // exp(m_old - m_new) before the tile's terms are added (stage 03 derives this rule).
        float m = -INFINITY, l = 0.0f;  // of row threadIdx.x, for the first BLOCK_Q threads
        for (int kv_start = 0; kv_start < len_kv; kv_start += BLOCK_KV) {
            __syncthreads();  // the previous tile's K and S are no longer read
            load_k_transposed<HEAD_DIM>(k_t, K + kv_offset + int64_t(kv_start) * HEAD_DIM,
                                        len_kv - kv_start);
            __syncthreads();
            tile_scores<HEAD_DIM>(s, q_tile, k_t, q_start, kv_start, len_kv, scale, causal);
            __syncthreads();
            if (threadIdx.x < BLOCK_Q) {
                const float* s_row = s + threadIdx.x * (BLOCK_KV + 1);
                float tile_max = -INFINITY;
                for (int col = 0; col < BLOCK_KV; ++col) tile_max = fmaxf(tile_max, s_row[col]);
                // Key 0 is visible to every row, so m is finite from the first tile on.
                const float m_new = fmaxf(m, tile_max);
                float tile_sum = 0.0f;
                for (int col = 0; col < BLOCK_KV; ++col) tile_sum += expf(s_row[col] - m_new);
                l = l * expf(m - m_new) + tile_sum;
                m = m_new;
            }
        }
        if (threadIdx.x < BLOCK_Q) {
            row_m[threadIdx.x] = m;
            row_l[threadIdx.x] = l;
        }
        // end excerpt

        // excerpt: pass-two
        // Pass 2: the scores again, now turned straight into normalized P and multiplied by V.
        float o[OUTPUTS] = {};
        for (int kv_start = 0; kv_start < len_kv; kv_start += BLOCK_KV) {
            __syncthreads();
            load_k_transposed<HEAD_DIM>(k_t, K + kv_offset + int64_t(kv_start) * HEAD_DIM,
                                        len_kv - kv_start);
            load_rows<BLOCK_KV, HEAD_DIM>(v_tile, V + kv_offset + int64_t(kv_start) * HEAD_DIM,
                                          len_kv - kv_start);
            __syncthreads();
            tile_scores<HEAD_DIM>(s, q_tile, k_t, q_start, kv_start, len_kv, scale, causal);
            __syncthreads();
            for (int index = threadIdx.x; index < BLOCK_Q * BLOCK_KV; index += THREADS) {
                const int row = index / BLOCK_KV;
                float& score = s[row * (BLOCK_KV + 1) + index % BLOCK_KV];
                score = expf(score - row_m[row]) / row_l[row];
            }
            __syncthreads();
            for (int col = 0; col < BLOCK_KV; ++col) {
                const float v_value = v_tile[col * HEAD_DIM + d];
#pragma unroll
                for (int e = 0; e < OUTPUTS; ++e)
                    o[e] += s[(row0 + e * ROW_STEP) * (BLOCK_KV + 1) + col] * v_value;
            }
        }
        // end excerpt

#pragma unroll
        for (int e = 0; e < OUTPUTS; ++e) {
            const int row = row0 + e * ROW_STEP;
            if (q_start + row < len_q) O[q_offset + int64_t(row) * HEAD_DIM + d] = o[e];
        }
        if (lse && threadIdx.x < BLOCK_Q && q_start + threadIdx.x < len_q)
            lse[int64_t(bh) * len_q + q_start + threadIdx.x] = m + logf(l);
    }
}

template <int HEAD_DIM>
void launch(const float* q, const float* k, const float* v, float* o, float* lse,
            const AttentionShape& shape, cudaStream_t stream) {
    const size_t bytes = SharedLayout<HEAD_DIM>::BYTES;
    CUDA_CHECK(cudaFuncSetAttribute(tiled_attention_kernel<HEAD_DIM>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    const int batch_heads = shape.batch * shape.heads;
    // x: query tiles (up to 2^31 - 1); y: batch x heads, looped over past the 65535 limit of y.
    const dim3 grid((shape.len_q + BLOCK_Q - 1) / BLOCK_Q, std::min(batch_heads, 65535));
    tiled_attention_kernel<HEAD_DIM><<<grid, THREADS, bytes, stream>>>(
        q, k, v, o, lse, batch_heads, shape.len_q, shape.len_kv, shape.softmax_scale(),
        shape.causal);
    CUDA_CHECK_LAUNCH();
}

}  // namespace

const StageCapabilities& stage_capabilities() {
    static const StageCapabilities caps{"02_tiled", "fp32", {64, 128}, MAX_LENGTH, MAX_LENGTH,
                                        true, false, 4};
    return caps;
}

size_t attention_workspace_bytes(const AttentionShape&) { return 0; }

void attention_forward(const float* q, const float* k, const float* v, float* o, float* lse,
                       const AttentionShape& shape, cudaStream_t stream) {
    validate_forward(shape, stage_capabilities(), q, k, v, o, lse);
    if (shape.head_dim == 64)
        launch<64>(q, k, v, o, lse, shape, stream);
    else
        launch<128>(q, k, v, o, lse, shape, stream);
}
