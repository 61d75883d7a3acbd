// Stage 05: BF16 tensor cores. The FlashAttention-2 loop of stages 03-04, but the two matrix
// products S = Q K^T and O += P V run on mma.sync.m16n8k16 (bf16 in, FP32 accumulate), fed
// from shared memory by ldmatrix. Each of the 4 warps owns 16 query rows of the 64-row tile;
// the softmax stays in FP32 registers and P goes from the S accumulators straight into the
// A operand of the second product. Tiles reach shared memory through cp.async and are stored
// XOR-swizzled, so that ldmatrix reads them without bank conflicts (build with
// NVCC_EXTRA=-DATTENTION_SWIZZLE=0 to measure the conflicts of the plain layout).
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

#ifndef ATTENTION_SWIZZLE
#define ATTENTION_SWIZZLE 1
#endif

namespace {

using bf16 = __nv_bfloat16;

constexpr int WARPS = 4;
constexpr int THREADS = WARPS * 32;
constexpr int ROWS_PER_WARP = 16;                // one mma row tile
constexpr int BLOCK_Q = WARPS * ROWS_PER_WARP;  // Br
constexpr int BLOCK_KV = 64;                     // Bc
constexpr int MAX_LENGTH = 1 << 30;              // keeps every tile index inside int
constexpr float LOG2E = 1.4426950408889634f;
constexpr unsigned FULL_MASK = 0xffffffffu;

template <int HEAD_DIM>
using Tile = TileLayout<HEAD_DIM, ATTENTION_SWIZZLE != 0>;

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

// One block: BLOCK_Q query rows of one (batch, head); the grid is q tiles x batch*heads with
// the q tile as the slow index, counted from the last, so causal's longest tiles start first.
template <int HEAD_DIM>
__global__ void __launch_bounds__(THREADS)
flash_forward_mma_kernel(const bf16* __restrict__ Q, const bf16* __restrict__ K,
                         const bf16* __restrict__ V, bf16* __restrict__ O,
                         float* __restrict__ lse, int batch_heads, int len_q, int len_kv,
                         int q_tiles, float scale, bool causal) {
    constexpr int QK_STEPS = HEAD_DIM / 16;  // k-steps of S = Q K^T (over the head dim)
    constexpr int PV_STEPS = BLOCK_KV / 16;  // k-steps of O = P V (over the keys)
    constexpr int S_TILES = BLOCK_KV / 8;    // 8-column tiles of S per warp
    constexpr int O_TILES = HEAD_DIM / 8;    // 8-column tiles of O per warp

    extern __shared__ __align__(128) unsigned char shared_memory[];
    bf16* q_tile = reinterpret_cast<bf16*>(shared_memory);  // [BLOCK_Q][HEAD_DIM]
    bf16* k_tile = q_tile + BLOCK_Q * HEAD_DIM;               // [BLOCK_KV][HEAD_DIM]
    bf16* v_tile = k_tile + BLOCK_KV * HEAD_DIM;              // [BLOCK_KV][HEAD_DIM]

    const int q_block = q_tiles - 1 - int(blockIdx.x / unsigned(batch_heads));
    const int64_t head = blockIdx.x % unsigned(batch_heads);
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

    load_tile<BLOCK_Q, HEAD_DIM, THREADS>(q_tile, q_head, q_start, len_q);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    // excerpt: fragments
    // The warp's 16 x HEAD_DIM slice of Q stays in registers as mma A fragments for the whole
    // loop. ldmatrix.x4: lanes 0-15 point at rows 0-15 of the left 8 columns, 16-31 the right.
    uint32_t q_fragment[QK_STEPS][4];
#pragma unroll
    for (int step = 0; step < QK_STEPS; ++step)
        ldmatrix_x4(q_fragment[step],
                    smem_address(q_tile + Tile<HEAD_DIM>::offset(warp_row + lane % 16,
                                                                 step * 16 + (lane / 16) * 8)));

    // Per-lane ldmatrix addresses, swizzle included, computed once. Moving 8 rows down or 64
    // columns right moves every element of the tile by the same amount (the XOR depends on
    // row % 8 and touches only the low 3 bits of the chunk), so each access below is one of
    // these bases plus a constant. K: lanes 0-7 give keys n*8+0..7 at dims step*16+0..7, lanes
    // 8-15 the same keys at dims +8..15: base per step % 4. V: lanes 0-15 give keys
    // step*16+0..15 at dims d*8..d*8+7: base per d % 8.
    uint32_t k_base[4], v_base[8];
#pragma unroll
    for (int c = 0; c < 4; ++c)
        k_base[c] = smem_address(k_tile + Tile<HEAD_DIM>::offset(lane % 8, c * 16 + (lane / 8) % 2 * 8));
#pragma unroll
    for (int c = 0; c < 8; ++c)
        v_base[c] = smem_address(v_tile + Tile<HEAD_DIM>::offset(lane % 16, c * 8));
    // end excerpt

    float o[O_TILES][4] = {};
    // Two rows per lane: [0] is fragment_row, [1] is fragment_row + 8. m is the running
    // max of the raw scores; l is this lane's share of the running sum (its columns only), summed
    // over the quad once at the end.
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.0f, 0.0f};
    const float scale_log2 = scale * LOG2E;  // exp(scale * x) = 2^(x * scale * log2 e)

    // Causal: keys past the tile's last row are masked for every row of it, skip their tiles.
    int kv_tiles = ceil_div(len_kv, BLOCK_KV);
    if (causal) kv_tiles = min(kv_tiles, ceil_div(q_start + BLOCK_Q, BLOCK_KV));

    for (int kv_tile = 0; kv_tile < kv_tiles; ++kv_tile) {
        const int kv_start = kv_tile * BLOCK_KV;
        __syncthreads();  // every warp is done reading the previous K and V tiles
        load_tile<BLOCK_KV, HEAD_DIM, THREADS>(k_tile, k_head, kv_start, len_kv);
        load_tile<BLOCK_KV, HEAD_DIM, THREADS>(v_tile, v_head, kv_start, len_kv);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
#pragma unroll
        for (int c = 0; c < 4; ++c) refresh_register(k_base[c]);
#pragma unroll
        for (int c = 0; c < 8; ++c) refresh_register(v_base[c]);

        // excerpt: qk-mma
        // S = Q K^T. K is stored [key][dim]: read as rows it is the column-major B operand
        // (dim x key) that mma wants, so no transpose. ldmatrix.x2: lanes 0-7 give the 8 keys
        // at dims step*16..+7, lanes 8-15 the same keys at dims +8..+15.
        float s[S_TILES][4] = {};
#pragma unroll
        for (int n = 0; n < S_TILES; ++n) {
#pragma unroll
            for (int step = 0; step < QK_STEPS; ++step) {
                uint32_t b0, b1;
                ldmatrix_x2(b0, b1, k_base[step % 4] + 2 * (n * 8 * HEAD_DIM + step / 4 * 64));
                mma_m16n8k16_bf16(s[n], q_fragment[step], b0, b1);
            }
        }
        // end excerpt

        // Mask only where a tile can hold a masked score: past len_kv, or above the diagonal.
        const bool needs_mask =
            kv_start + BLOCK_KV > len_kv || (causal && kv_start + BLOCK_KV - 1 > q_start + warp_row);
        if (needs_mask) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                // Column c of this lane's scores (key kv_start + c + fragment_column) is visible
                // iff c < visible: one compare against a constant per score.
                const int row = q_start + warp_row + fragment_row + r * 8;
                const int visible = (causal ? min(len_kv, row + 1) : len_kv) - kv_start - fragment_column;
#pragma unroll
                for (int n = 0; n < S_TILES; ++n)
#pragma unroll
                    for (int i = 0; i < 2; ++i)
                        if (n * 8 + i >= visible) s[n][2 * r + i] = -INFINITY;
            }
        }

        // Online softmax in FP32. A row is spread over the 4 lanes of a quad: reduce its max
        // with two butterfly shuffles (lane ^ 1, lane ^ 2).
        float m_new[2] = {m[0], m[1]};
#pragma unroll
        for (int n = 0; n < S_TILES; ++n) {
            m_new[0] = fmaxf(m_new[0], fmaxf(s[n][0], s[n][1]));
            m_new[1] = fmaxf(m_new[1], fmaxf(s[n][2], s[n][3]));
        }
        float alpha[2], max_offset[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            m_new[r] = fmaxf(m_new[r], __shfl_xor_sync(FULL_MASK, m_new[r], 1));
            m_new[r] = fmaxf(m_new[r], __shfl_xor_sync(FULL_MASK, m_new[r], 2));
            // A row with no visible key yet keeps max -inf: use 0 so that no inf - inf appears.
            max_offset[r] = m_new[r] == -INFINITY ? 0.0f : m_new[r] * scale_log2;
            alpha[r] = fast_exp2(m[r] * scale_log2 - max_offset[r]);  // 0 on the first tile
            m[r] = m_new[r];
            l[r] *= alpha[r];
        }

        // excerpt: p-to-a-operand
        // P = exp(scale * (S - m)), rounded to bf16 and packed as the A operand of O += P V:
        // the accumulator layout of two neighbouring 8-key tiles is exactly the A fragment of
        // one 16-key k-step (tile 2k gives registers 0 and 1, tile 2k+1 registers 2 and 3).
        uint32_t p_fragment[PV_STEPS][4];
#pragma unroll
        for (int n = 0; n < S_TILES; ++n) {
            const float p0 = fast_exp2(fmaf(s[n][0], scale_log2, -max_offset[0]));
            const float p1 = fast_exp2(fmaf(s[n][1], scale_log2, -max_offset[0]));
            const float p2 = fast_exp2(fmaf(s[n][2], scale_log2, -max_offset[1]));
            const float p3 = fast_exp2(fmaf(s[n][3], scale_log2, -max_offset[1]));
            l[0] += p0 + p1;
            l[1] += p2 + p3;
            p_fragment[n / 2][(n % 2) * 2 + 0] = pack_bf16x2(p0, p1);
            p_fragment[n / 2][(n % 2) * 2 + 1] = pack_bf16x2(p2, p3);
        }

#pragma unroll
        for (int d = 0; d < O_TILES; ++d) {
            o[d][0] *= alpha[0];
            o[d][1] *= alpha[0];
            o[d][2] *= alpha[1];
            o[d][3] *= alpha[1];
        }

        // O += P V. V is stored [key][dim], but the B operand must hold two consecutive keys
        // of one dim per register: ldmatrix.trans transposes each 8x8 block on the way.
        // Lanes 0-7 give keys step*16..+7, lanes 8-15 keys +8..+15, at dims d*8..d*8+7.
#pragma unroll
        for (int step = 0; step < PV_STEPS; ++step) {
#pragma unroll
            for (int d = 0; d < O_TILES; ++d) {
                uint32_t b0, b1;
                ldmatrix_x2_trans(b0, b1, v_base[d % 8] + 2 * (step * 16 * HEAD_DIM + d / 8 * 64));
                mma_m16n8k16_bf16(o[d], p_fragment[step], b0, b1);
            }
        }
        // end excerpt
    }

    // Finish l over the quad, normalize, store the rows that exist. LSE = m * scale + ln(l).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(FULL_MASK, l[r], 1);
        l[r] += __shfl_xor_sync(FULL_MASK, l[r], 2);
        const int row = q_start + warp_row + fragment_row + r * 8;
        if (row >= len_q) continue;
        const float inverse_sum = 1.0f / l[r];
        bf16* o_row = O + (head * len_q + row) * HEAD_DIM;
#pragma unroll
        for (int d = 0; d < O_TILES; ++d)
            *reinterpret_cast<__nv_bfloat162*>(o_row + d * 8 + fragment_column) =
                __floats2bfloat162_rn(o[d][2 * r] * inverse_sum,
                                      o[d][2 * r + 1] * inverse_sum);
        if (lse != nullptr && lane % 4 == 0)
            lse[head * len_q + row] = m[r] * scale + logf(l[r]);
    }
}

template <int HEAD_DIM>
void launch(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
            const AttentionShape& shape, cudaStream_t stream) {
    const int batch_heads = shape.batch * shape.heads;
    const int q_tiles = ceil_div(shape.len_q, BLOCK_Q);
    const int64_t blocks = int64_t(q_tiles) * batch_heads;
    if (blocks > INT_MAX)
        throw std::invalid_argument("attention: batch * heads * ceil(len_q / " +
                                    std::to_string(BLOCK_Q) + ") = " + std::to_string(blocks) +
                                    " is not allowed: must be at most 2^31 - 1");
    const size_t shared_bytes = size_t(BLOCK_Q + 2 * BLOCK_KV) * HEAD_DIM * sizeof(bf16);
    auto kernel = flash_forward_mma_kernel<HEAD_DIM>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(shared_bytes)));
    kernel<<<unsigned(blocks), THREADS, shared_bytes, stream>>>(
        q, k, v, o, lse, batch_heads, shape.len_q, shape.len_kv, q_tiles, shape.softmax_scale(),
        shape.causal);
    CUDA_CHECK_LAUNCH();
}

}  // namespace

const StageCapabilities& stage_capabilities() {
    // 16-byte alignment: every cp.async moves 16 bytes.
    static const StageCapabilities caps{"05_mma_swizzle", "bf16", {64, 128}, MAX_LENGTH,
                                        MAX_LENGTH, true, false, 16};
    return caps;
}

size_t attention_workspace_bytes(const AttentionShape&) { return 0; }

void attention_forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                       const AttentionShape& shape, cudaStream_t stream) {
    validate_forward(shape, stage_capabilities(), q, k, v, o, lse);
    if (shape.head_dim == 64)
        launch<64>(q, k, v, o, lse, shape, stream);
    else
        launch<128>(q, k, v, o, lse, shape, stream);
}
