// The cuBLAS eager attention baseline: what a framework without a fused kernel runs.
//   S = scale * Q K^T      one strided-batched GEMM into a device workspace of B*H*Lq*Lk floats
//   P = softmax(mask(S))   one block per row, written in place over S, with LSE on the way
//   O = P V                a second strided-batched GEMM
// It implements the stage contract (attention.h) so that the same test suite checks it and the
// same benchmark driver times it. Built twice, for FP32 (bench/cublas_fp32) and BF16
// (bench/cublas_bf16); ATTENTION_DTYPE_BF16 selects the element type.
//
// Numerics: both GEMMs accumulate in FP32; the scores S stay FP32 and the softmax computes in
// FP32, so that LSE is FP32-accurate as the contract asks of every implementation; P and O take
// the element type. In BF16 that is the "plain bf16" numerics the tests compare with (P rounded
// to bf16 before P V). PyTorch eager in BF16 also rounds S to bf16; bench/baselines.py times
// that as torch_eager. The FP32 build runs on the FP32 units: CUBLAS_COMPUTE_32F under the
// default math mode never uses TF32.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "attention.h"
#include "cublas_check.h"
#include "cuda_check.h"
#include "element.h"
#include "validate.h"
#include "workspace.h"

#ifndef ATTENTION_STAGE_NAME
#define ATTENTION_STAGE_NAME "cublas_eager"
#endif

namespace {

#if defined(ATTENTION_DTYPE_BF16)
constexpr cudaDataType_t kCublasElement = CUDA_R_16BF;
// Round to nearest even.
__device__ Element from_float(float x) { return __float2bfloat16(x); }
#else
constexpr cudaDataType_t kCublasElement = CUDA_R_32F;
__device__ Element from_float(float x) { return x; }
#endif
// P is stored over S: row r of P starts where row r of S starts, so P's rows are this many
// elements apart per key (2 * len_kv elements in BF16, len_kv in FP32).
constexpr int P_ROW_STRIDE_PER_KEY = int(sizeof(float) / sizeof(Element));

constexpr int SOFTMAX_THREADS = 256;
constexpr int WARP_SIZE = 32;
// Enough blocks to fill any current GPU many times over; longer row counts loop.
constexpr int64_t MAX_SOFTMAX_BLOCKS = int64_t(1) << 20;

// (m, l) of the union of two disjoint sets of scores: m the max, l the sum of exp(s - m).
__device__ void merge_softmax_state(float& m, float& l, float other_m, float other_l) {
    const float new_m = fmaxf(m, other_m);
    if (new_m == -INFINITY) return;  // both empty: exp(-inf - -inf) would be NaN
    l = l * expf(m - new_m) + other_l * expf(other_m - new_m);
    m = new_m;
}

// One block per row of S (grid-striding when there are more rows than blocks). Pass 1 reads the
// visible part of the row once with the online-softmax update per thread, then merges the
// threads' states. Pass 2 writes the row of P over the start of the row of S, zero where the
// causal mask hides a key (the P V GEMM reads full rows). Every row sees key 0, so l > 0.
__global__ void masked_softmax_kernel(float* scores, float* lse, int64_t rows, int len_q,
                                      int len_kv, bool causal) {
    __shared__ float warp_m[SOFTMAX_THREADS / WARP_SIZE];
    __shared__ float warp_l[SOFTMAX_THREADS / WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;

    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* S = scores + row * len_kv;
        Element* P = reinterpret_cast<Element*>(scores + row * len_kv);
        const int query = int(row % len_q);
        // Top-left causal alignment: query i sees keys 0..i.
        const int visible = causal ? min(query + 1, len_kv) : len_kv;

        float m = -INFINITY, l = 0.0f;
        for (int j = threadIdx.x; j < visible; j += blockDim.x) {
            const float s = S[j];
            if (s > m) {
                l = l * expf(m - s) + 1.0f;
                m = s;
            } else {
                l += expf(s - m);
            }
        }
        for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) {
            const float other_m = __shfl_xor_sync(0xffffffffu, m, offset);
            const float other_l = __shfl_xor_sync(0xffffffffu, l, offset);
            merge_softmax_state(m, l, other_m, other_l);
        }
        if (lane == 0) {
            warp_m[warp] = m;
            warp_l[warp] = l;
        }
        __syncthreads();
        m = warp_m[0];
        l = warp_l[0];
        for (int w = 1; w < SOFTMAX_THREADS / WARP_SIZE; ++w)
            merge_softmax_state(m, l, warp_m[w], warp_l[w]);

        // In chunks of one key per thread. P[j] overlaps S[j / P_ROW_STRIDE_PER_KEY], never a
        // key after j: a chunk's writes only land on scores this chunk or an earlier one has
        // read, and the barrier holds the writes until every thread has read its score.
        const float inverse_l = 1.0f / l;
        for (int chunk = 0; chunk < len_kv; chunk += blockDim.x) {
            const int j = chunk + threadIdx.x;
            const float p = j < visible ? expf(S[j] - m) * inverse_l : 0.0f;
            __syncthreads();
            if (j < len_kv) P[j] = from_float(p);
        }
        if (threadIdx.x == 0 && lse != nullptr) lse[row] = m + logf(l);
        __syncthreads();  // warp_m and warp_l are rewritten for the next row
    }
}

// One handle per device, created on first use and kept for the process: creating one costs
// milliseconds. The handles are destroyed by an atexit hook registered after the first one is
// made, so it runs before the CUDA runtime's own teardown (atexit hooks run in reverse order)
// and a leak checker sees cuBLAS's memory returned. Calls from several host threads at once on
// one device are not supported.
std::mutex handle_mutex;
std::map<int, cublasHandle_t> handles;

void destroy_cublas_handles() {
    std::lock_guard<std::mutex> lock(handle_mutex);
    for (auto& [device, handle] : handles) {
        cudaSetDevice(device);
        cublasDestroy(handle);  // at exit there is no one left to report a failure to
    }
    handles.clear();
}

cublasHandle_t cublas_handle_for_current_device() {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(handle_mutex);
    auto found = handles.find(device);
    if (found != handles.end()) return found->second;
    cublasHandle_t handle = nullptr;
    CUBLAS_CHECK(cublasCreate(&handle));
    CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    if (handles.empty()) std::atexit(destroy_cublas_handles);
    handles[device] = handle;
    return handle;
}

}  // namespace

const StageCapabilities& stage_capabilities() {
    static const StageCapabilities capabilities = [] {
        StageCapabilities c;
        // The build's name (cublas_fp32 or cublas_bf16), as every stage reports its folder.
        c.name = ATTENTION_STAGE_NAME;
        c.dtype = kElementName;
        c.head_dims = {32, 64, 128, 256};
        // cuBLAS takes each GEMM dimension and leading dimension as an int (P's rows are
        // P_ROW_STRIDE_PER_KEY * len_kv elements apart); the workspace bounds the rest.
        c.max_len_q = INT_MAX;
        c.max_len_kv = INT_MAX / P_ROW_STRIDE_PER_KEY;
        c.causal = true;
        c.backward = false;
        // cuBLAS's vectorized (tensor-core) GEMM kernels want 16-byte aligned matrices; it would
        // fall back to slow ones silently, so the baseline asks for what a framework provides.
        c.alignment_bytes = 16;
        return c;
    }();
    return capabilities;
}

size_t attention_workspace_bytes(const AttentionShape& shape) {
    // S in FP32, overwritten in place by P.
    return saturating_product({size_t(shape.batch), size_t(shape.heads), size_t(shape.len_q),
                               size_t(shape.len_kv), sizeof(float)});
}

void attention_forward(const Element* q, const Element* k, const Element* v, Element* o, float* lse,
                       const AttentionShape& shape, cudaStream_t stream) {
    // The shape and the workspace it needs, then the pointers, before anything is allocated.
    validate_shape(shape, stage_capabilities());
    Workspace::require_fits(attention_workspace_bytes(shape));
    validate_forward(shape, stage_capabilities(), q, k, v, o, lse);
    const int64_t batch_count = int64_t(shape.batch) * shape.heads;
    if (batch_count > INT_MAX)
        throw std::invalid_argument("batch * heads = " + std::to_string(batch_count) +
                                    ": cuBLAS takes the batch count as an int, at most " +
                                    std::to_string(INT_MAX));
    Workspace workspace(attention_workspace_bytes(shape), stream);
    float* S = workspace.as<float>();

    cublasHandle_t handle = cublas_handle_for_current_device();
    CUBLAS_CHECK(cublasSetStream(handle, stream));

    // cuBLAS is column-major: a row-major [L, D] matrix is its column-major D x L transpose.
    // Row-major S[Lq, Lk] = Q K^T is then column-major S^T (Lk x Lq) = K^T (Lk x D) * Q (D x Lq).
    const int Lq = shape.len_q, Lk = shape.len_kv, D = shape.head_dim;
    const long long q_stride = (long long)Lq * D, kv_stride = (long long)Lk * D;
    const long long s_stride = (long long)Lq * Lk;
    const float scale = shape.softmax_scale(), one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        handle, CUBLAS_OP_T, CUBLAS_OP_N, Lk, Lq, D, &scale, k, kCublasElement, D, kv_stride, q,
        kCublasElement, D, q_stride, &zero, S, CUDA_R_32F, Lk, s_stride, int(batch_count),
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));

    const int64_t rows = batch_count * Lq;
    const int blocks = int(std::min(rows, MAX_SOFTMAX_BLOCKS));
    masked_softmax_kernel<<<blocks, SOFTMAX_THREADS, 0, stream>>>(S, lse, rows, Lq, Lk,
                                                                  shape.causal);
    CUDA_CHECK_LAUNCH();

    // Row-major O[Lq, D] = P V is column-major O^T (D x Lq) = V^T (D x Lk) * P^T (Lk x Lq),
    // with P's rows P_ROW_STRIDE_PER_KEY * Lk elements apart, where the softmax left them.
    const int p_row_stride = Lk * P_ROW_STRIDE_PER_KEY;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        handle, CUBLAS_OP_N, CUBLAS_OP_N, D, Lq, Lk, &one, v, kCublasElement, D, kv_stride,
        reinterpret_cast<const Element*>(S), kCublasElement, p_row_stride,
        (long long)Lq * p_row_stride, &zero, o, kCublasElement, D, q_stride, int(batch_count),
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
