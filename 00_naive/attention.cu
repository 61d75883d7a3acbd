// Stage 00: attention as three kernels, the way the formula reads.
//   1. S = scale * Q K^T, written to a [batch * heads, len_q, len_kv] workspace in device memory
//   2. P = softmax(S) row by row, in place, also writing LSE = m + log(l)
//   3. O = P V
// Every element of S is written once and read three times from device memory: that N x N
// traffic, and the N x N memory, are what the later stages remove.
#include <algorithm>
#include <climits>
#include <cmath>

#include "attention.h"
#include "cuda_check.h"
#include "validate.h"
#include "workspace.h"

namespace {

constexpr int TILE = 16;  // threads per block side for the two element-wise 2D kernels

// Keys visible to query `row`: top-left causal alignment (key j is seen iff j <= row).
__device__ __forceinline__ int visible_keys(int row, int len_kv, bool causal) {
    return causal ? min(row + 1, len_kv) : len_kv;
}

// excerpt: scores
// One thread per score S[i][j]. Masked scores are never written: the softmax reads only the
// visible prefix of each row.
__global__ void scores_kernel(const float* __restrict__ Q, const float* __restrict__ K,
                              float* __restrict__ S, int batch_heads, int len_q, int len_kv,
                              int head_dim, float scale, bool causal) {
    const int i = blockIdx.y * TILE + threadIdx.y;
    const int j = blockIdx.x * TILE + threadIdx.x;
    if (i >= len_q || j >= visible_keys(i, len_kv, causal)) return;
    for (int bh = blockIdx.z; bh < batch_heads; bh += gridDim.z) {
        const float* q_row = Q + (int64_t(bh) * len_q + i) * head_dim;
        const float* k_row = K + (int64_t(bh) * len_kv + j) * head_dim;
        float dot = 0.0f;
        for (int d = 0; d < head_dim; ++d) dot += q_row[d] * k_row[d];
        S[(int64_t(bh) * len_q + i) * len_kv + j] = dot * scale;
    }
}
// end excerpt

// excerpt: softmax
// One thread per row: three passes over the row (max, sum of exponentials, normalize).
__global__ void softmax_kernel(float* __restrict__ S, float* __restrict__ lse, int batch_heads,
                               int len_q, int len_kv, bool causal) {
    const int64_t row_index = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (row_index >= int64_t(batch_heads) * len_q) return;
    const int i = int(row_index % len_q);
    const int keys = visible_keys(i, len_kv, causal);
    float* row = S + row_index * len_kv;

    float m = -INFINITY;
    for (int j = 0; j < keys; ++j) m = fmaxf(m, row[j]);
    float l = 0.0f;
    for (int j = 0; j < keys; ++j) {
        const float p = expf(row[j] - m);
        row[j] = p;
        l += p;
    }
    const float inverse_l = 1.0f / l;
    for (int j = 0; j < keys; ++j) row[j] *= inverse_l;
    if (lse) lse[row_index] = m + logf(l);
}
// end excerpt

// One thread per output element O[i][d]; threads along d read V coalesced.
__global__ void pv_kernel(const float* __restrict__ P, const float* __restrict__ V,
                          float* __restrict__ O, int batch_heads, int len_q, int len_kv,
                          int head_dim, bool causal) {
    const int i = blockIdx.y * TILE + threadIdx.y;
    const int d = blockIdx.x * TILE + threadIdx.x;
    if (i >= len_q || d >= head_dim) return;
    const int keys = visible_keys(i, len_kv, causal);
    for (int bh = blockIdx.z; bh < batch_heads; bh += gridDim.z) {
        const float* p_row = P + (int64_t(bh) * len_q + i) * len_kv;
        const float* v_head = V + int64_t(bh) * len_kv * head_dim;
        float sum = 0.0f;
        for (int j = 0; j < keys; ++j) sum += p_row[j] * v_head[int64_t(j) * head_dim + d];
        O[(int64_t(bh) * len_q + i) * head_dim + d] = sum;
    }
}

}  // namespace

const StageCapabilities& stage_capabilities() {
    // Lengths are bounded by gridDim.y (65535 tiles of TILE rows) and by the workspace.
    static const StageCapabilities caps{
        "00_naive", "fp32", {32, 64, 128, 256}, 65535 * TILE, INT_MAX, true, false, 4};
    return caps;
}

size_t attention_workspace_bytes(const AttentionShape& shape) {
    return saturating_product({size_t(shape.batch), size_t(shape.heads), size_t(shape.len_q),
                               size_t(shape.len_kv), sizeof(float)});
}

void attention_forward(const float* q, const float* k, const float* v, float* o, float* lse,
                       const AttentionShape& shape, cudaStream_t stream) {
    // The shape and the workspace it needs, then the pointers, before anything is allocated.
    validate_shape(shape, stage_capabilities());
    Workspace::require_fits(attention_workspace_bytes(shape));
    validate_forward(shape, stage_capabilities(), q, k, v, o, lse);
    Workspace scores(attention_workspace_bytes(shape), stream);
    float* S = scores.as<float>();

    const int batch_heads = shape.batch * shape.heads;
    const unsigned grid_z = unsigned(std::min(batch_heads, 65535));
    const dim3 block(TILE, TILE);

    const dim3 scores_grid((shape.len_kv + TILE - 1) / TILE, (shape.len_q + TILE - 1) / TILE,
                           grid_z);
    scores_kernel<<<scores_grid, block, 0, stream>>>(q, k, S, batch_heads, shape.len_q,
                                                     shape.len_kv, shape.head_dim,
                                                     shape.softmax_scale(), shape.causal);
    CUDA_CHECK_LAUNCH();

    const int rows_per_block = 128;
    const int64_t rows = int64_t(batch_heads) * shape.len_q;
    softmax_kernel<<<unsigned((rows + rows_per_block - 1) / rows_per_block), rows_per_block, 0,
                     stream>>>(S, lse, batch_heads, shape.len_q, shape.len_kv, shape.causal);
    CUDA_CHECK_LAUNCH();

    const dim3 pv_grid((shape.head_dim + TILE - 1) / TILE, (shape.len_q + TILE - 1) / TILE,
                       grid_z);
    pv_kernel<<<pv_grid, block, 0, stream>>>(S, v, o, batch_heads, shape.len_q, shape.len_kv,
                                             shape.head_dim, shape.causal);
    CUDA_CHECK_LAUNCH();
}
