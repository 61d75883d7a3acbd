// Stage 08: the Hopper instructions. The copy engine (TMA) moves whole Q, K and V tiles into
// shared memory, one thread asking for each, and counts the bytes on an mbarrier that the warps
// wait on; K and V go through a ring of two stages, so tile j+1 arrives while tile j is used.
// S = Q K^T and O += P V run on wgmma: a warpgroup (four warps) multiplies 64 query rows at once,
// asynchronously, reading K and V (and Q) straight from shared memory through matrix
// descriptors, with P passed from registers. No ldmatrix, no cp.async, no swizzle arithmetic in
// the kernel: TMA writes the 128-byte swizzle that wgmma reads.
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

// One kernel configuration. Every warpgroup owns 64 query rows (wgmma's M); they all do the same
// work, in step. A tile of HEAD_DIM columns is stored as HEAD_DIM / 64 slabs of [rows][64]: a
// 128-byte swizzled row holds 64 bf16, so wider heads take several slabs side by side.
template <int HEAD_DIM_, int WARPGROUPS_, int BLOCK_KV_, int STAGES_>
struct Tiling {
    static constexpr int HEAD_DIM = HEAD_DIM_;
    static constexpr int WARPGROUPS = WARPGROUPS_;
    static constexpr int THREADS = 128 * WARPGROUPS;
    static constexpr int BLOCK_Q = 64 * WARPGROUPS;  // Br
    static constexpr int BLOCK_KV = BLOCK_KV_;       // Bc
    static constexpr int STAGES = STAGES_;           // K and V tiles in flight
    static constexpr int SLABS = HEAD_DIM / 64;
    static constexpr uint32_t Q_BYTES = BLOCK_Q * HEAD_DIM * sizeof(bf16);
    static constexpr uint32_t KV_BYTES = BLOCK_KV * HEAD_DIM * sizeof(bf16);
    // + 1024: the tiles start on a 1024-byte boundary (the swizzle atom), rounded up in-kernel.
    static constexpr size_t SHARED_BYTES = Q_BYTES + 2 * STAGES * size_t(KV_BYTES) + 1024;
};

using Tiling64 = Tiling<64, 2, 128, 2>;
using Tiling128 = Tiling<128, 2, 128, 2>;

constexpr int MAX_LENGTH = 1 << 30;  // keeps every tile index and TMA coordinate inside int
constexpr float LOG2E = 1.4426950408889634f;
constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr uint32_t SLAB_ROW_BYTES = 64 * sizeof(bf16);  // one swizzled row: 128 bytes

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// One block: BLOCK_Q query rows of one (batch, head), the grid ordered as in stage 06 (heads in
// L2-sized groups, the longest causal tiles first).
template <class Config>
__global__ void __launch_bounds__(Config::THREADS, 1)
flash_forward_wgmma_kernel(const __grid_constant__ CUtensorMap q_map,
                           const __grid_constant__ CUtensorMap k_map,
                           const __grid_constant__ CUtensorMap v_map, bf16* __restrict__ O,
                           float* __restrict__ lse, int batch_heads, int group_heads, int len_q,
                           int len_kv, int q_tiles, float scale, bool causal) {
    constexpr int HEAD_DIM = Config::HEAD_DIM, BLOCK_Q = Config::BLOCK_Q;
    constexpr int BLOCK_KV = Config::BLOCK_KV, STAGES = Config::STAGES, SLABS = Config::SLABS;
    constexpr int QK_STEPS = HEAD_DIM / 16;  // k-steps of S = Q K^T (over the head dim)
    constexpr int PV_STEPS = BLOCK_KV / 16;  // k-steps of O = P V (over the keys)

    __shared__ uint64_t q_full;             // Q has landed
    __shared__ uint64_t kv_full[STAGES];    // K_j and V_j of the stage have landed
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
    const int warpgroup = int(threadIdx.x) / 128;
    const int warp = int(threadIdx.x) % 128 / 32;  // inside the warpgroup
    const int lane = int(threadIdx.x) % 32;
    // wgmma accumulators: this thread holds rows fragment_row and fragment_row + 8 of its warp's
    // 16, columns 8i + fragment_column and one more.
    const int fragment_row = lane / 4;
    const int fragment_column = 2 * (lane % 4);
    const int warpgroup_row = warpgroup * 64;  // first row of this warpgroup inside the tile
    TIMELINE_BEGIN;  // the phase stamps (common/timeline.cuh): nothing unless measured

    int kv_tiles = ceil_div(len_kv, BLOCK_KV);
    if (causal) kv_tiles = min(kv_tiles, ceil_div(q_start + BLOCK_Q, BLOCK_KV));

    // excerpt: tma-ring
    // One thread asks the copy engine for a K and a V tile: SLABS boxes of [BLOCK_KV][64] each,
    // all counted on the stage's barrier. Rows past len_kv arrive as zeros.
    auto load_kv = [&](int kv_tile) {
        const int stage = kv_tile % STAGES;
        mbarrier_arrive_expect_tx(&kv_full[stage], 2 * Config::KV_BYTES);
        for (int slab = 0; slab < SLABS; ++slab) {
            const int offset = (stage * SLABS + slab) * BLOCK_KV * 64;
            tma_load_3d(k_tiles + offset, &k_map, slab * 64, kv_tile * BLOCK_KV, head, &kv_full[stage]);
            tma_load_3d(v_tiles + offset, &v_map, slab * 64, kv_tile * BLOCK_KV, head, &kv_full[stage]);
        }
    };

    if (threadIdx.x == 0) {
        mbarrier_init(&q_full, 1);
        for (int stage = 0; stage < STAGES; ++stage) mbarrier_init(&kv_full[stage], 1);
        fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbarrier_arrive_expect_tx(&q_full, Config::Q_BYTES);
        for (int slab = 0; slab < SLABS; ++slab)
            tma_load_3d(q_tile + slab * BLOCK_Q * 64, &q_map, slab * 64, q_start, head, &q_full);
        for (int kv_tile = 0; kv_tile < min(STAGES, kv_tiles); ++kv_tile) load_kv(kv_tile);
    }
    // end excerpt

    // excerpt: descriptors
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
    // end excerpt

    float o_accumulator[HEAD_DIM / 2] = {};
    // Rows fragment_row ([0]) and fragment_row + 8 ([1]): m is the running max of the raw
    // scores, l this thread's share of the running sum (its columns only), summed over the quad
    // of threads that share the row once at the end.
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.0f, 0.0f};
    const float scale_log2 = scale * LOG2E;  // exp(scale * x) = 2^(x * scale * log2 e)

    TIMELINE_STAMP(TIMELINE_START, 0);
    mbarrier_wait(&q_full, 0);
    // excerpt: s-wgmma
    for (int kv_tile = 0; kv_tile < kv_tiles; ++kv_tile) {
        const int stage = kv_tile % STAGES;
        const int kv_start = kv_tile * BLOCK_KV;
        // The stage is refilled every STAGES tiles: its barrier's phase parity flips each time.
        mbarrier_wait(&kv_full[stage], (kv_tile / STAGES) % 2);
        TIMELINE_STAMP(TIMELINE_TILE_READY, kv_tile);

        // S = Q K^T: HEAD_DIM / 16 wgmma, both operands from shared memory, then wait for them.
        float s[BLOCK_KV / 2];
        fence_registers(s);
        wgmma_fence();
#pragma unroll
        for (int step = 0; step < QK_STEPS; ++step)
            Wgmma<BLOCK_KV>::template ss<0, 0>(s, q_descriptor(step), k_descriptor(stage, step), step > 0);
        wgmma_commit();
        TIMELINE_STAMP(TIMELINE_ISSUED, kv_tile);
        wgmma_wait<0>();
        TIMELINE_STAMP(TIMELINE_S_DONE, kv_tile);
        fence_registers(s);
    // end excerpt

        // Mask only where a tile can hold a masked score: past len_kv, or above the diagonal.
        const bool needs_mask =
            kv_start + BLOCK_KV > len_kv || (causal && kv_start + BLOCK_KV - 1 > q_start + warpgroup_row);
        if (needs_mask) {
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
        }

        // Online softmax in FP32, as in stage 06: the quad's max by two shuffles, the rescale
        // factor alpha for O and l, then P = exp(scale * (S - m)) packed as bf16 A fragments.
        float m_new[2] = {m[0], m[1]};
#pragma unroll
        for (int n = 0; n < BLOCK_KV / 8; ++n) {
            m_new[0] = fmaxf(m_new[0], fmaxf(s[4 * n + 0], s[4 * n + 1]));
            m_new[1] = fmaxf(m_new[1], fmaxf(s[4 * n + 2], s[4 * n + 3]));
        }
        float alpha[2], max_offset[2];
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
        // The accumulators of 8-column tiles 2k and 2k+1 are exactly the A fragment of k-step k.
        uint32_t p[PV_STEPS][4];
#pragma unroll
        for (int n = 0; n < BLOCK_KV / 8; ++n) {
            const float p0 = fast_exp2(fmaf(s[4 * n + 0], scale_log2, -max_offset[0]));
            const float p1 = fast_exp2(fmaf(s[4 * n + 1], scale_log2, -max_offset[0]));
            const float p2 = fast_exp2(fmaf(s[4 * n + 2], scale_log2, -max_offset[1]));
            const float p3 = fast_exp2(fmaf(s[4 * n + 3], scale_log2, -max_offset[1]));
            l[0] += p0 + p1;
            l[1] += p2 + p3;
            p[n / 2][(n % 2) * 2 + 0] = pack_bf16x2(p0, p1);
            p[n / 2][(n % 2) * 2 + 1] = pack_bf16x2(p2, p3);
        }
#pragma unroll
        for (int d = 0; d < HEAD_DIM / 8; ++d) {
            o_accumulator[4 * d + 0] *= alpha[0];
            o_accumulator[4 * d + 1] *= alpha[0];
            o_accumulator[4 * d + 2] *= alpha[1];
            o_accumulator[4 * d + 3] *= alpha[1];
        }

        // excerpt: pv-wgmma
        // O += P V: P from registers, V through its MN-major descriptor.
        TIMELINE_STAMP(TIMELINE_SOFTMAX_DONE, kv_tile);
        fence_registers(o_accumulator);
        wgmma_fence();
#pragma unroll
        for (int step = 0; step < PV_STEPS; ++step)
            Wgmma<HEAD_DIM>::template rs<1>(o_accumulator, p[step], v_descriptor(stage, step), 1);
        wgmma_commit();
        TIMELINE_STAMP(TIMELINE_ISSUED, kv_tile);
        wgmma_wait<0>();
        TIMELINE_STAMP(TIMELINE_PV_DONE, kv_tile);
        fence_registers(o_accumulator);

        // Every warpgroup is done with this stage: refill it with tile j + STAGES.
        __syncthreads();
        if (threadIdx.x == 0 && kv_tile + STAGES < kv_tiles) load_kv(kv_tile + STAGES);
    }
        // end excerpt

    // Finish l over the quad, normalize, store the rows that exist. LSE = m * scale + ln(l).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float sum = l[r];
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        sum += __shfl_xor_sync(FULL_MASK, sum, 2);
        const int row = q_start + warpgroup_row + warp * 16 + fragment_row + r * 8;
        if (row >= len_q) continue;
        const float inverse_sum = 1.0f / sum;
        bf16* o_row = O + (int64_t(head) * len_q + row) * HEAD_DIM;
#pragma unroll
        for (int d = 0; d < HEAD_DIM / 8; ++d)
            *reinterpret_cast<__nv_bfloat162*>(o_row + d * 8 + fragment_column) =
                __floats2bfloat162_rn(o_accumulator[4 * d + 2 * r] * inverse_sum,
                                      o_accumulator[4 * d + 2 * r + 1] * inverse_sum);
        if (lse != nullptr && lane % 4 == 0) lse[int64_t(head) * len_q + row] = m[r] * scale + logf(sum);
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
    auto kernel = flash_forward_wgmma_kernel<Config>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(Config::SHARED_BYTES)));
    kernel<<<unsigned(blocks), Config::THREADS, Config::SHARED_BYTES, stream>>>(
        q_map, k_map, v_map, o, lse, batch_heads, heads_per_l2_group(shape), shape.len_q,
        shape.len_kv, q_tiles, shape.softmax_scale(), shape.causal);
    CUDA_CHECK_LAUNCH();
}

}  // namespace

const StageCapabilities& stage_capabilities() {
    // 16-byte alignment: TMA needs the tensors' base addresses on 16-byte boundaries.
    // Compute capability 9.0: wgmma and TMA exist on Hopper only.
    static const StageCapabilities caps{"08_wgmma_tma", "bf16", {64, 128}, MAX_LENGTH,
                                        MAX_LENGTH, true, false, 16, 90};
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
