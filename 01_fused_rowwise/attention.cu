// Stage 01: one fused kernel, one block per query row.
// The row of scores lives in shared memory instead of device memory: the block computes it,
// reduces its max and its sum with shared-memory trees, and multiplies it by V, all without
// an N x N matrix anywhere. The price: the longest key sequence is what fits in shared memory.
// K is read through a small shared-memory slice so that a warp's loads are coalesced: a
// thread per key walking its own K row would touch 32 rows (32 sectors) per load instruction.
#include <algorithm>
#include <climits>
#include <cmath>

#include "attention.h"
#include "cuda_check.h"
#include "validate.h"

namespace {

constexpr int THREADS = 256;  // 8 warps: enough loads in flight to stream K and V from L2
constexpr int MAX_HEAD_DIM = 256;
constexpr int COLUMNS = MAX_HEAD_DIM / THREADS;  // output columns per thread at most
constexpr int SLICE = 16;  // head-dim columns of THREADS keys staged at a time
constexpr int SLICE_STRIDE = SLICE + 1;  // odd padding: thread t reads bank (17 t + c) % 32

__device__ __forceinline__ int visible_keys(int row, int len_kv, bool causal) {
    return causal ? min(row + 1, len_kv) : len_kv;
}

// excerpt: block-reduce
// Tree reduction over the block through shared memory; every thread gets the result.
template <class Op>
__device__ float block_reduce(float value, float* scratch, Op op) {
    scratch[threadIdx.x] = value;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride)
            scratch[threadIdx.x] = op(scratch[threadIdx.x], scratch[threadIdx.x + stride]);
        __syncthreads();
    }
    const float result = scratch[0];
    __syncthreads();  // scratch is reused by the next reduction
    return result;
}
// end excerpt

// Dynamic shared memory: the query row, the reduction scratch, the K slice, the score row.
__global__ void __launch_bounds__(THREADS)
fused_rowwise_kernel(const float* __restrict__ Q, const float* __restrict__ K,
                     const float* __restrict__ V, float* __restrict__ O, float* __restrict__ lse,
                     int batch_heads, int len_q, int len_kv, int head_dim, float scale,
                     bool causal) {
    extern __shared__ float shared[];
    float* q_row = shared;                  // head_dim
    float* scratch = q_row + head_dim;      // THREADS
    float* k_slice = scratch + THREADS;     // THREADS x SLICE_STRIDE
    float* scores = k_slice + THREADS * SLICE_STRIDE;  // len_kv

    const int64_t rows = int64_t(batch_heads) * len_q;
    for (int64_t row_index = blockIdx.x; row_index < rows; row_index += gridDim.x) {
        const int64_t bh = row_index / len_q;
        const int i = int(row_index % len_q);
        const int keys = visible_keys(i, len_kv, causal);
        const float* k_head = K + bh * len_kv * head_dim;
        const float* v_head = V + bh * len_kv * head_dim;

        for (int d = threadIdx.x; d < head_dim; d += THREADS) q_row[d] = Q[row_index * head_dim + d];
        __syncthreads();

        // excerpt: score-row
        // Scores: thread t owns key j = chunk + t of each chunk of THREADS keys. The chunk's K
        // rows come through shared memory SLICE columns at a time; each warp copies 64-byte
        // segments of two K rows, so the loads are coalesced.
        float local_max = -INFINITY;
        for (int chunk = 0; chunk < keys; chunk += THREADS) {
            const int j = chunk + threadIdx.x;
            float dot = 0.0f;
            for (int d0 = 0; d0 < head_dim; d0 += SLICE) {
                for (int e = threadIdx.x; e < THREADS * SLICE; e += THREADS) {
                    const int r = e / SLICE, c = e % SLICE;
                    if (chunk + r < keys)
                        k_slice[r * SLICE_STRIDE + c] =
                            k_head[int64_t(chunk + r) * head_dim + d0 + c];
                }
                __syncthreads();
                if (j < keys)
                    for (int c = 0; c < SLICE; ++c)
                        dot += q_row[d0 + c] * k_slice[threadIdx.x * SLICE_STRIDE + c];
                __syncthreads();  // the next slice overwrites k_slice
            }
            if (j < keys) {
                scores[j] = dot * scale;
                local_max = fmaxf(local_max, scores[j]);
            }
        }
        const float m = block_reduce(local_max, scratch, [](float a, float b) { return fmaxf(a, b); });

        float local_sum = 0.0f;
        for (int j = threadIdx.x; j < keys; j += THREADS) {
            const float p = expf(scores[j] - m);
            scores[j] = p;
            local_sum += p;
        }
        const float l = block_reduce(local_sum, scratch, [](float a, float b) { return a + b; });
        // end excerpt
        // block_reduce ended on a barrier, so every p is visible to every thread now.

        // O = P V / l. Threads split into THREADS / head_dim groups over the keys; neighbours
        // in a group read neighbouring elements of a V row (coalesced). A head dim wider than
        // the block gives each thread COLUMNS columns, d = column + c * THREADS.
        const int groups = max(1, THREADS / head_dim);
        const int group = threadIdx.x / head_dim;
        const int column = head_dim >= THREADS ? threadIdx.x : threadIdx.x % head_dim;
        float partial[COLUMNS] = {};
#pragma unroll 8
        for (int j = group; j < keys; j += groups) {
            const float p = scores[j];
            const float* v_row = v_head + int64_t(j) * head_dim;
#pragma unroll
            for (int c = 0; c < COLUMNS; ++c)
                if (column + c * THREADS < head_dim) partial[c] += p * v_row[column + c * THREADS];
        }
        // Sum the groups' partial rows in the score row's space, which is free now.
        __syncthreads();
#pragma unroll
        for (int c = 0; c < COLUMNS; ++c)
            if (column + c * THREADS < head_dim)
                scores[group * head_dim + column + c * THREADS] = partial[c];
        __syncthreads();
        const float inverse_l = 1.0f / l;
        for (int d = threadIdx.x; d < head_dim; d += THREADS) {
            float sum = 0.0f;
            for (int g = 0; g < groups; ++g) sum += scores[g * head_dim + d];
            O[row_index * head_dim + d] = sum * inverse_l;
        }
        if (lse && threadIdx.x == 0) lse[row_index] = m + logf(l);
        __syncthreads();  // the next row overwrites q_row and scores
    }
}

size_t shared_bytes(int len_kv, int head_dim) {
    // The score row doubles as the space for the groups' partial output rows.
    return sizeof(float) * (size_t(head_dim) + THREADS + THREADS * SLICE_STRIDE +
                            std::max({len_kv, THREADS, head_dim}));
}

int opt_in_shared_bytes() {
    int device = 0, bytes = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess) {
        cudaGetLastError();  // no GPU: clear the error and assume the portable 48 KB
        return 48 * 1024;
    }
    return bytes;
}

}  // namespace

const StageCapabilities& stage_capabilities() {
    // The longest key row is what the device lets one block hold in shared memory, next to
    // the query row of the largest head dim, the reduction scratch and the K slice.
    static const StageCapabilities caps = [] {
        const int bytes = opt_in_shared_bytes();
        const int max_len_kv =
            bytes / int(sizeof(float)) - MAX_HEAD_DIM - THREADS - THREADS * SLICE_STRIDE;
        return StageCapabilities{"01_fused_rowwise", "fp32", {32, 64, 128, 256}, INT_MAX,
                                 max_len_kv, true, false, 4};
    }();
    return caps;
}

size_t attention_workspace_bytes(const AttentionShape&) { return 0; }

void attention_forward(const float* q, const float* k, const float* v, float* o, float* lse,
                       const AttentionShape& shape, cudaStream_t stream) {
    validate_forward(shape, stage_capabilities(), q, k, v, o, lse);
    const size_t bytes = shared_bytes(shape.len_kv, shape.head_dim);
    CUDA_CHECK(cudaFuncSetAttribute(fused_rowwise_kernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    const int batch_heads = shape.batch * shape.heads;
    const int64_t rows = int64_t(batch_heads) * shape.len_q;
    const unsigned grid = unsigned(std::min<int64_t>(rows, INT_MAX));
    fused_rowwise_kernel<<<grid, THREADS, bytes, stream>>>(q, k, v, o, lse, batch_heads,
                                                           shape.len_q, shape.len_kv,
                                                           shape.head_dim, shape.softmax_scale(),
                                                           shape.causal);
    CUDA_CHECK_LAUNCH();
}
