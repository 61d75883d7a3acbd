// Stage 04: the fastest FP32 kernel of the course. The algorithm is stage 03's one-pass online
// softmax; what changes is how the work is laid out on the machine.
// Stage 03 spent two shared-memory loads on every multiply-add and reduced each row with one
// thread while the others waited. Here every thread keeps a 4 x COLS tile of S and a 4 x
// HEAD_DIM/8 tile of O in registers (each value loaded from shared memory feeds several FMAs),
// the 8 lanes that share a row reduce its max and sum with __shfl_xor_sync, all loads are
// 128-bit (float4), the tiles are padded so that those float4 loads hit distinct banks, and
// exp2f with scale * log2(e) folded into the scores replaces expf.
#include <algorithm>
#include <climits>
#include <cmath>

#include "attention.h"
#include "cuda_check.h"
#include "validate.h"

namespace {

// Tuning knobs (the chapter's exercises): make NVCC_EXTRA="-DATTENTION_BLOCK_Q=128
// -DATTENTION_MIN_BLOCKS=2" builds a variant with 256 threads per block, capped at 128 registers.
#ifndef ATTENTION_BLOCK_Q
#define ATTENTION_BLOCK_Q 64
#endif
#ifndef ATTENTION_MIN_BLOCKS
#define ATTENTION_MIN_BLOCKS 1
#endif
#ifndef ATTENTION_PAD  // -DATTENTION_PAD=0 brings back the bank conflicts the padding removes
#define ATTENTION_PAD 4
#endif
constexpr int BLOCK_Q = ATTENTION_BLOCK_Q;  // query rows per block
constexpr int ROWS_PER_THREAD = 4;        // rows of S and O held by one thread
constexpr int LANES_PER_ROW = 8;          // lanes that share a row: reductions are 3 shuffles
constexpr int ROW_GROUPS = BLOCK_Q / ROWS_PER_THREAD;
constexpr int PAD = ATTENTION_PAD;  // floats added to each shared-memory row
static_assert(PAD % 4 == 0, "rows must stay 16-byte aligned for float4 loads");
constexpr int THREADS = ROW_GROUPS * LANES_PER_ROW;
// Keys per tile: 64 at head dim 64; 32 at 128, so that two blocks still share an SM.
template <int HEAD_DIM>
constexpr int BLOCK_KV = HEAD_DIM <= 64 ? 64 : 32;
constexpr int MAX_LENGTH = INT_MAX - BLOCK_Q;
constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

// Shared memory, in floats. Rows of Q, K and V are padded by PAD = 4 floats: the 8 lanes of a
// row group read 8 different rows at the same column with float4 loads, and a row stride of
// HEAD_DIM + 4 floats puts those 8 x 16 bytes in 8 different groups of 4 banks.
// P is stored transposed, [key][query], so that one float4 load gives a thread its 4 rows.
template <int HEAD_DIM>
struct SharedLayout {
    static constexpr int LD = HEAD_DIM + PAD;
    static constexpr int LD_P = BLOCK_Q + PAD;
    static constexpr int Q = 0;                                 // [BLOCK_Q][LD]
    static constexpr int K = Q + BLOCK_Q * LD;                  // [BLOCK_KV][LD]
    static constexpr int V = K + BLOCK_KV<HEAD_DIM> * LD;       // [BLOCK_KV][LD]
    static constexpr int P = V + BLOCK_KV<HEAD_DIM> * LD;       // [BLOCK_KV][LD_P]
    static constexpr int FLOATS = P + BLOCK_KV<HEAD_DIM> * LD_P;
    static constexpr size_t BYTES = sizeof(float) * FLOATS;
};

// Rows past the end of the sequence load as zeros: never read out of bounds, and a zero V row
// times a zero probability stays zero. Every row starts 16-byte aligned (HEAD_DIM * 4 bytes
// from an aligned base), so each thread moves one float4: consecutive threads, consecutive
// 16 bytes of a row.
template <int ROWS, int HEAD_DIM>
__device__ void load_rows(float* tile, const float* source, int rows_left) {
    constexpr int VECTORS = HEAD_DIM / 4;
    for (int index = threadIdx.x; index < ROWS * VECTORS; index += THREADS) {
        const int row = index / VECTORS;
        const int vector = index % VECTORS;
        float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (row < rows_left)
            value = __ldg(reinterpret_cast<const float4*>(source + int64_t(row) * HEAD_DIM) +
                          vector);
        *reinterpret_cast<float4*>(tile + row * SharedLayout<HEAD_DIM>::LD + vector * 4) = value;
    }
}

// excerpt: shuffle-reductions
__device__ __forceinline__ float row_max(float value) {
#pragma unroll
    for (int offset = 1; offset < LANES_PER_ROW; offset *= 2)
        value = fmaxf(value, __shfl_xor_sync(FULL_MASK, value, offset));
    return value;
}

__device__ __forceinline__ float row_sum(float value) {
#pragma unroll
    for (int offset = 1; offset < LANES_PER_ROW; offset *= 2)
        value += __shfl_xor_sync(FULL_MASK, value, offset);
    return value;
}
// end excerpt

__device__ __forceinline__ void fma4(float4& acc, float a, const float4& b) {
    acc.x = fmaf(a, b.x, acc.x);
    acc.y = fmaf(a, b.y, acc.y);
    acc.z = fmaf(a, b.z, acc.z);
    acc.w = fmaf(a, b.w, acc.w);
}

// Thread layout: a warp is 4 row groups x 8 lanes. Row group g owns the rows g + ROW_GROUPS * r
// (r < 4): one row of each quarter of the tile, so that the 4 row groups of a warp read 4
// neighbouring rows of Q (distinct banks). Lane c of the group owns the keys c + 8 * k of the
// KV tile (neighbouring rows of K, distinct banks again) and the output columns
// 4 * c + 32 * v ... + 3 (a warp writes whole 128-byte segments of O).
template <int HEAD_DIM>
__global__ void __launch_bounds__(THREADS, ATTENTION_MIN_BLOCKS)
warp_shuffle_attention_kernel(const float* __restrict__ Q, const float* __restrict__ K,
                    const float* __restrict__ V, float* __restrict__ O, float* __restrict__ lse,
                    int batch_heads, int len_q, int len_kv, float scale_log2, bool causal) {
    using Layout = SharedLayout<HEAD_DIM>;
    constexpr int LD = Layout::LD, LD_P = Layout::LD_P;
    constexpr int TILE_KV = BLOCK_KV<HEAD_DIM>;
    constexpr int COLS = TILE_KV / LANES_PER_ROW;          // keys of S per thread
    constexpr int VECTORS = HEAD_DIM / (4 * LANES_PER_ROW);  // float4 columns of O per thread
    extern __shared__ float4 shared4[];
    float* shared = reinterpret_cast<float*>(shared4);
    float* q_tile = shared + Layout::Q;
    float* k_tile = shared + Layout::K;
    float* v_tile = shared + Layout::V;
    float* p_tile = shared + Layout::P;

    const int lane = threadIdx.x % 32;
    const int col_lane = lane % LANES_PER_ROW;
    const int row_group = threadIdx.x / LANES_PER_ROW;
    const int q_start = blockIdx.x * BLOCK_Q;
    for (int bh = blockIdx.y; bh < batch_heads; bh += gridDim.y) {
        const int64_t q_offset = (int64_t(bh) * len_q + q_start) * HEAD_DIM;
        const int64_t kv_offset = int64_t(bh) * len_kv * HEAD_DIM;
        __syncthreads();  // every warp is done with the previous head's Q tile
        load_rows<BLOCK_Q, HEAD_DIM>(q_tile, Q + q_offset, len_q - q_start);

        const int kv_end = causal ? min(len_kv, q_start + BLOCK_Q) : len_kv;
        // m and l of the thread's rows, in log2 units; l is this lane's share of the row sum,
        // added across the 8 lanes only once at the end (they all share the same m).
        float m[ROWS_PER_THREAD], l[ROWS_PER_THREAD];
        float4 o[ROWS_PER_THREAD][VECTORS];
#pragma unroll
        for (int r = 0; r < ROWS_PER_THREAD; ++r) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
#pragma unroll
            for (int v = 0; v < VECTORS; ++v) o[r][v] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }

        for (int kv_start = 0; kv_start < kv_end; kv_start += TILE_KV) {
            __syncthreads();  // the previous tile's K, V and P are no longer read
            load_rows<TILE_KV, HEAD_DIM>(k_tile, K + kv_offset + int64_t(kv_start) * HEAD_DIM,
                                         len_kv - kv_start);
            load_rows<TILE_KV, HEAD_DIM>(v_tile, V + kv_offset + int64_t(kv_start) * HEAD_DIM,
                                         len_kv - kv_start);
            __syncthreads();

            // excerpt: register-tile
            // S = Q K^T for the thread's 4 x COLS scores: per 4 dims, 4 + COLS float4 loads
            // feed 16 * COLS FMAs (stage 03: 2 scalar loads per FMA).
            float s[ROWS_PER_THREAD][COLS] = {};
#pragma unroll 2
            for (int d = 0; d < HEAD_DIM; d += 4) {
                float4 q4[ROWS_PER_THREAD], k4[COLS];
#pragma unroll
                for (int r = 0; r < ROWS_PER_THREAD; ++r)
                    q4[r] = *reinterpret_cast<const float4*>(
                        q_tile + (row_group + ROW_GROUPS * r) * LD + d);
#pragma unroll
                for (int c = 0; c < COLS; ++c)
                    k4[c] = *reinterpret_cast<const float4*>(
                        k_tile + (col_lane + LANES_PER_ROW * c) * LD + d);
#pragma unroll
                for (int r = 0; r < ROWS_PER_THREAD; ++r)
#pragma unroll
                    for (int c = 0; c < COLS; ++c) {
                        s[r][c] = fmaf(q4[r].x, k4[c].x, s[r][c]);
                        s[r][c] = fmaf(q4[r].y, k4[c].y, s[r][c]);
                        s[r][c] = fmaf(q4[r].z, k4[c].z, s[r][c]);
                        s[r][c] = fmaf(q4[r].w, k4[c].w, s[r][c]);
                    }
            }
            // end excerpt

            // excerpt: online-update
            // Only a tile that crosses the end of the keys or the causal diagonal needs a mask.
            const bool needs_mask =
                kv_start + TILE_KV > len_kv || (causal && kv_start + TILE_KV - 1 > q_start);
#pragma unroll
            for (int r = 0; r < ROWS_PER_THREAD; ++r) {
                const int i = q_start + row_group + ROW_GROUPS * r;
                float tile_max = -INFINITY;
#pragma unroll
                for (int c = 0; c < COLS; ++c) {
                    // exp(x * scale) = exp2(x * scale * log2(e)): one MUFU.EX2, no extra FMUL.
                    float score = s[r][c] * scale_log2;
                    if (needs_mask) {
                        const int j = kv_start + col_lane + LANES_PER_ROW * c;
                        if (j >= len_kv || (causal && j > i)) score = -INFINITY;
                    }
                    s[r][c] = score;
                    tile_max = fmaxf(tile_max, score);
                }
                // Key 0 is visible to every row, so m is finite from the first tile on.
                const float m_new = fmaxf(m[r], row_max(tile_max));
                const float alpha = exp2f(m[r] - m_new);
                m[r] = m_new;
                float tile_sum = 0.0f;
#pragma unroll
                for (int c = 0; c < COLS; ++c) {
                    s[r][c] = exp2f(s[r][c] - m_new);
                    tile_sum += s[r][c];
                }
                l[r] = l[r] * alpha + tile_sum;
#pragma unroll
                for (int v = 0; v < VECTORS; ++v) {
                    o[r][v].x *= alpha;
                    o[r][v].y *= alpha;
                    o[r][v].z *= alpha;
                    o[r][v].w *= alpha;
                }
            }
            // end excerpt

            // excerpt: p-through-shared
            // P goes through shared memory because the P V product needs every key of a row,
            // and a row's keys are spread over 8 lanes. A warp's rows are its own, so a warp
            // barrier suffices. Column 4 * row_group + r of the transposed tile holds row r of
            // the group, so that one float4 load returns the thread's 4 rows.
#pragma unroll
            for (int c = 0; c < COLS; ++c)
                *reinterpret_cast<float4*>(p_tile + (col_lane + LANES_PER_ROW * c) * LD_P +
                                           4 * row_group) =
                    make_float4(s[0][c], s[1][c], s[2][c], s[3][c]);
            __syncwarp();

            // O += P V: per key, 1 + VECTORS float4 loads feed 16 * VECTORS FMAs.
#pragma unroll 4
            for (int j = 0; j < TILE_KV; ++j) {
                const float4 p =
                    *reinterpret_cast<const float4*>(p_tile + j * LD_P + 4 * row_group);
#pragma unroll
                for (int v = 0; v < VECTORS; ++v) {
                    const float4 v4 = *reinterpret_cast<const float4*>(
                        v_tile + j * LD + 4 * col_lane + 4 * LANES_PER_ROW * v);
                    fma4(o[0][v], p.x, v4);
                    fma4(o[1][v], p.y, v4);
                    fma4(o[2][v], p.z, v4);
                    fma4(o[3][v], p.w, v4);
                }
            }
            // end excerpt
        }

#pragma unroll
        for (int r = 0; r < ROWS_PER_THREAD; ++r) {
            const int row = row_group + ROW_GROUPS * r;
            const float row_l = row_sum(l[r]);
            if (q_start + row >= len_q) continue;
            const float inverse_l = 1.0f / row_l;
            float* o_row = O + q_offset + int64_t(row) * HEAD_DIM;
#pragma unroll
            for (int v = 0; v < VECTORS; ++v) {
                const float4 value = make_float4(o[r][v].x * inverse_l, o[r][v].y * inverse_l,
                                                 o[r][v].z * inverse_l, o[r][v].w * inverse_l);
                *reinterpret_cast<float4*>(o_row + 4 * col_lane + 4 * LANES_PER_ROW * v) = value;
            }
            if (lse && col_lane == 0)
                lse[int64_t(bh) * len_q + q_start + row] = (m[r] + log2f(row_l)) * LN2;
        }
    }
}

template <int HEAD_DIM>
void launch(const float* q, const float* k, const float* v, float* o, float* lse,
            const AttentionShape& shape, cudaStream_t stream) {
    const size_t bytes = SharedLayout<HEAD_DIM>::BYTES;
    CUDA_CHECK(cudaFuncSetAttribute(warp_shuffle_attention_kernel<HEAD_DIM>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    const int batch_heads = shape.batch * shape.heads;
    // x: query tiles (up to 2^31 - 1); y: batch x heads, looped over past the 65535 limit of y.
    const dim3 grid((shape.len_q + BLOCK_Q - 1) / BLOCK_Q, std::min(batch_heads, 65535));
    warp_shuffle_attention_kernel<HEAD_DIM><<<grid, THREADS, bytes, stream>>>(
        q, k, v, o, lse, batch_heads, shape.len_q, shape.len_kv, shape.softmax_scale() * LOG2E,
        shape.causal);
    CUDA_CHECK_LAUNCH();
}

}  // namespace

const StageCapabilities& stage_capabilities() {
    // 16-byte alignment for the float4 loads and stores: with head dims that are multiples of
    // 4, every row of an aligned tensor is then aligned too.
    static const StageCapabilities caps{"04_warp_shuffle", "fp32", {64, 128}, MAX_LENGTH,
                                        MAX_LENGTH, true, false, 16};
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
