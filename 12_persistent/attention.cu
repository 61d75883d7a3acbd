// Stage 12: a persistent grid. Stage 10 launches one block per work tile (BLOCK_Q query rows
// of one head), and every block pays what no other block can hide: its launch, the set-up of
// its barriers, the copy of its Q and a first S = Q K^T with nothing to overlap, the epilogue
// that stores O; the last wave leaves SMs idle. Here one block per SM walks many work tiles.
// The producer's loader picks them (block b starts with tile b and then takes b + the grid's
// size, ...; causal, where work tiles differ in length, the next one of a counter, longest
// first) and announces each in a ring of shared memory that the consumers and a storer read.
// The K/V ring and the consumers' turns run on from one work tile to the next, and the first
// S = Q K^T of a work tile goes to the tensor cores with the last P V of the one before. O
// leaves through staging buffers of its own, which the storer warp copies out with TMA: no
// consumer waits for its store. The loop over one work tile's K/V tiles is stage 10's.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include "attention.h"
#include "cuda_check.h"
#include "hopper.cuh"
#include "divisor.h"
#include "split_plan.h"
#include "ptx.cuh"
#include "timeline.cuh"
#include "validate.h"
#include "workspace.h"

namespace {

using bf16 = __nv_bfloat16;

// Dynamic shared memory a block may have on the H100 (and every sm_90): 227 KiB, less 1 KiB for
// the kernel's static barriers and schedule (under 300 bytes).
constexpr size_t MAX_SHARED_BYTES = 227 * 1024 - 1024;

// One kernel configuration. Warpgroup 0 is the producer; each consumer warpgroup owns 64 query
// rows (wgmma's M). A tile of HEAD_DIM columns is stored as HEAD_DIM / 64 slabs of [rows][64]: a
// 128-byte swizzled row holds 64 bf16, so wider heads take several slabs side by side. O leaves
// through O_BUFFERS staging buffers of 64 rows, apart from Q, so that the next work tile's Q can
// land while O is stored: one per consumer where shared memory has room, else one that the
// consumers take in turn (the 176-key kernel: 225 KiB with one, 241 with two).
template <int HEAD_DIM_, int CONSUMERS_, int BLOCK_KV_, int STAGES_>
struct Tiling {
    static constexpr int HEAD_DIM = HEAD_DIM_;
    static constexpr int CONSUMERS = CONSUMERS_;     // consumer warpgroups
    static constexpr int THREADS = 128 * (1 + CONSUMERS);
    static constexpr int BLOCK_Q = 64 * CONSUMERS;   // Br
    static constexpr int BLOCK_KV = BLOCK_KV_;       // Bc
    static constexpr int STAGES = STAGES_;           // K and V tiles in flight
    static constexpr int SLABS = HEAD_DIM / 64;
    // Registers per thread after setmaxnreg: the producer keeps few, the consumers take the
    // rest of what the block starts with (LAUNCH_REGISTERS each, the cap __launch_bounds__
    // gives; multiples of 8). The producer's loader and storer walk the work tiles, which takes
    // more than the 24 of a one-tile block: 128 x 40 + 256 x 232 = 64,512 with two consumers;
    // 128 x 32 + 384 x 160 = 65,536 with three (fewer for those would serialize their wgmma).
    static constexpr int LAUNCH_REGISTERS = 65536 / THREADS / 8 * 8;
    static constexpr int PRODUCER_REGISTERS = CONSUMERS == 2 ? 40 : 32;
    static constexpr int CONSUMER_REGISTERS = CONSUMERS == 2 ? 232 : 160;
    static_assert((LAUNCH_REGISTERS - PRODUCER_REGISTERS) * 128 ==
                      (CONSUMER_REGISTERS - LAUNCH_REGISTERS) * 128 * CONSUMERS,
                  "the consumers take exactly what the producer gives back");
    static constexpr uint32_t Q_BYTES = BLOCK_Q * HEAD_DIM * sizeof(bf16);
    static constexpr uint32_t Q_ROWS_BYTES = 64 * HEAD_DIM * sizeof(bf16);  // one consumer's rows
    static constexpr uint32_t KV_BYTES = BLOCK_KV * HEAD_DIM * sizeof(bf16);
    static constexpr uint32_t O_BYTES = 64 * HEAD_DIM * sizeof(bf16);        // one O buffer
    // + 1024: the tiles start on a 1024-byte boundary (the swizzle atom), rounded up in-kernel.
    static constexpr size_t TILE_BYTES = Q_BYTES + 2 * STAGES * size_t(KV_BYTES) + 1024;
    static constexpr int O_BUFFERS =
        TILE_BYTES + CONSUMERS * size_t(O_BYTES) <= MAX_SHARED_BYTES ? CONSUMERS : 1;
    static constexpr size_t SHARED_BYTES = TILE_BYTES + O_BUFFERS * size_t(O_BYTES);
    static_assert(SHARED_BYTES <= MAX_SHARED_BYTES, "no room for even one O buffer");
};

// Tuned on the H100 (lab notes 10 have the alternatives): at D = 64 three consumers share each
// K/V tile, so a tile feeds 192 query rows; at D = 128 the non-causal kernel takes 176 keys per
// tile, and the causal one 128 (a wider tile wastes more of its work on the diagonal).
using Tiling64 = Tiling<64, 3, 128, 2>;
using Tiling128 = Tiling<128, 2, 176, 2>;
using Tiling128Causal = Tiling<128, 2, 128, 2>;
static_assert(Tiling64::O_BUFFERS == 3 && Tiling128::O_BUFFERS == 1 && Tiling128Causal::O_BUFFERS == 2);
template <class Config>
constexpr bool fits_register_file =
    Config::PRODUCER_REGISTERS * 128 + Config::CONSUMER_REGISTERS * 128 * Config::CONSUMERS <= 65536;
static_assert(fits_register_file<Tiling64> && fits_register_file<Tiling128> &&
              fits_register_file<Tiling128Causal>);

constexpr int MAX_LENGTH = 1 << 30;  // keeps every tile index and TMA coordinate inside int
constexpr float LOG2E = 1.4426950408889634f;
constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr uint32_t SLAB_ROW_BYTES = 64 * sizeof(bf16);  // one swizzled row: 128 bytes
constexpr int SCHEDULE_SLOTS = 4;  // work tiles announced ahead of the consumers

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// excerpt: tile-order
// The divisors of the grid order (work_tile): work tiles per group of heads, heads per group
// (the last group may have fewer), and a split work tile's parts, with the parts' K/V tiles
// worked out once (n / parts and n mod parts, split_plan.h's part_begin).
struct TileOrder {
    Divisor group_tiles, group_heads, last_group_heads, parts;
    int last_group, part_kv_tiles, part_extra;
};
inline TileOrder make_tile_order(int batch_heads, int group_heads, int q_tiles, int parts, int kv_tiles) {
    const int groups = ceil_div(batch_heads, group_heads);
    return TileOrder{make_divisor(group_heads * q_tiles), make_divisor(group_heads),
                     make_divisor(batch_heads - (groups - 1) * group_heads), make_divisor(parts),
                     groups - 1, kv_tiles / parts, kv_tiles % parts};
}
// end excerpt

// excerpt: work-tile
// A work tile: BLOCK_Q query rows of one (batch, head), and how many K/V tiles it reads.
// kv_tiles == 0 says that the block has no more work.
// Non-causal, the last round's work tiles may be split along K/V (split_plan.h): a part reads
// kv_tiles K/V tiles from kv_begin on, and `part` numbers its slot in the workspace of partial
// O and LSE; a whole tile has kv_begin 0 and part WHOLE.
constexpr int WHOLE = -1;
struct WorkTile {
    int head, q_start, kv_tiles, kv_begin, part;
};

// Work tile number `tile` in stage 06's grid order: heads in L2-sized groups, the longest causal
// tiles first inside a group.
template <class Config>
__device__ __forceinline__ WorkTile work_tile(int tile, const TileOrder& order, int q_tiles, int len_kv,
                                              bool causal) {
    const int group = order.group_tiles.divide(tile);
    const int first_head = group * order.group_heads.value;
    const Divisor heads_in_group = group == order.last_group ? order.last_group_heads : order.group_heads;
    const int rank = tile - group * order.group_tiles.value;
    const int q_rank = heads_in_group.divide(rank);  // rank / heads_in_group
    const int q_block = q_tiles - 1 - q_rank;
    WorkTile work{first_head + rank - q_rank * heads_in_group.value, q_block * Config::BLOCK_Q,
                  ceil_div(len_kv, Config::BLOCK_KV), 0, WHOLE};
    // Causal: keys past the tile's last row are masked for every row of it, skip their tiles.
    if (causal) work.kv_tiles = min(work.kv_tiles, ceil_div(work.q_start + Config::BLOCK_Q, Config::BLOCK_KV));
    return work;
}
// end excerpt

// excerpt: work-item
// Work item `item` of the block's walk (of `items`: past them, the end): the first `whole` are
// whole work tiles; after them each of the last work tiles comes as `parts` parts, one after
// the other (item whole + j is part j % parts of work tile whole + j / parts, workspace slot j).
// Whole items come first in every block's walk (b, then b + gridDim.x, ... or the counter's next
// items: increasing either way), which keeps the storer's protocol as it was: see the storer.
// Only the D = 64 configuration splits (its exponentials bound it, and its last round is the
// longest share of the call; at D = 128 the split measured no gain and its code cost 1-2%,
// lab notes 12). The others' items are whole tiles from kv_begin 0, known at compile time, so
// their consumers and storer compile to stage 12's code without the split (the loader still
// writes kv_begin and part into the schedule slot).
template <class Config>
constexpr bool splits = Config::HEAD_DIM == 64;
template <class Config>
__device__ __forceinline__ WorkTile work_item(int item, int items, int whole, const TileOrder& order,
                                              int q_tiles, int len_kv, bool causal) {
    if (item >= items) return WorkTile{0, 0, 0, 0, WHOLE};  // no more work
    if (!splits<Config> || item < whole) return work_tile<Config>(item, order, q_tiles, len_kv, causal);
    const int j = item - whole;
    const int split_tile = order.parts.divide(j);
    WorkTile work = work_tile<Config>(whole + split_tile, order, q_tiles, len_kv, false);
    const int part = j - split_tile * order.parts.value;
    work.kv_begin = part_begin_of(part, order.part_kv_tiles, order.part_extra);
    work.kv_tiles = part_begin_of(part + 1, order.part_kv_tiles, order.part_extra) - work.kv_begin;
    work.part = j;
    return work;
}
// end excerpt

// A persistent grid: one block per SM walks work tiles. The producer warp picks them (block b
// starts with tile b; then, with `tile_counter`, the next one not taken by any block, else
// b + gridDim.x, b + 2 gridDim.x, ...) and announces each in a small ring of shared memory; the
// K/V ring and the consumers' turns run on from one work tile to the next, and the consumers
// treat all the K/V tiles of the block as one sequence: the first S = Q K^T of a work tile goes
// to the tensor cores with the last P V of the one before, whose O is normalized and staged
// while it runs. A second producer warp stores O with TMA. __launch_bounds__ caps the registers
// from the block's thread count (384 threads: 168 each), the budget setmaxnreg moves between
// the warpgroups. ONE_TILE: the grid has a block for every work tile (fewer work tiles than
// SMs, or a causal call below the counter's threshold), so each block's first work tile is its
// only one and nobody waits for the ring's slot: every role reads it where the storer's thread
// left it before the barrier.
template <class Config, bool ONE_TILE>
__global__ void __launch_bounds__(Config::THREADS, 1)
flash_forward_pingpong_kernel(const __grid_constant__ CUtensorMap q_map,
                                 const __grid_constant__ CUtensorMap k_map,
                                 const __grid_constant__ CUtensorMap v_map,
                                 const __grid_constant__ CUtensorMap o_map, float* __restrict__ lse,
                                 int* __restrict__ tile_counter, float* __restrict__ split_o,
                                 float* __restrict__ split_lse, const TileOrder order, int len_q,
                                 int len_kv, int q_tiles, int total_tiles, int whole_tiles, float scale,
                                 bool causal) {
    constexpr int HEAD_DIM = Config::HEAD_DIM, BLOCK_Q = Config::BLOCK_Q, CONSUMERS = Config::CONSUMERS;
    constexpr int BLOCK_KV = Config::BLOCK_KV, STAGES = Config::STAGES, SLABS = Config::SLABS;
    constexpr int O_BUFFERS = Config::O_BUFFERS;
    constexpr int QK_STEPS = HEAD_DIM / 16;  // k-steps of S = Q K^T (over the head dim)
    constexpr int PV_STEPS = BLOCK_KV / 16;  // k-steps of O = P V (over the keys)

    constexpr int CONSUMER_WARPS = 4 * CONSUMERS;
    constexpr bool SPLITS = splits<Config>;  // false at D = 128: every item whole (work_item)
    __shared__ WorkTile schedule[SCHEDULE_SLOTS];     // the block's work tiles, in order
    __shared__ uint64_t schedule_full[SCHEDULE_SLOTS];   // the slot holds the next work tile
    __shared__ uint64_t schedule_empty[SCHEDULE_SLOTS];  // every reader has read it
    __shared__ uint64_t q_full[CONSUMERS];     // the consumer's rows of Q have landed
    __shared__ uint64_t q_empty[CONSUMERS];    // its last S = Q K^T of the work tile is done
    __shared__ uint64_t k_full[STAGES];        // the stage's K tile has landed
    __shared__ uint64_t v_full[STAGES];        // the stage's V tile has landed
    __shared__ uint64_t k_empty[STAGES];       // every consumer warp is done with the stage's K
    __shared__ uint64_t v_empty[STAGES];       // every consumer warp is done with the stage's V
    __shared__ uint64_t o_full[O_BUFFERS];     // a consumer has staged its O in the buffer
    __shared__ uint64_t o_empty[CONSUMERS];    // the buffer the consumer uses next has been stored
    extern __shared__ unsigned char dynamic_shared[];
    bf16* q_tile = reinterpret_cast<bf16*>(
        (reinterpret_cast<uintptr_t>(dynamic_shared) + 1023) & ~uintptr_t(1023));
    bf16* k_tiles = q_tile + BLOCK_Q * HEAD_DIM;             // [STAGES][SLABS][BLOCK_KV][64]
    bf16* v_tiles = k_tiles + STAGES * BLOCK_KV * HEAD_DIM;  // [STAGES][SLABS][BLOCK_KV][64]
    bf16* o_tiles = v_tiles + STAGES * BLOCK_KV * HEAD_DIM;  // [O_BUFFERS][SLABS][64][64]

    // -1: the producer; 0, 1: consumers. Read from lane 0, so that the compiler knows it is the
    // same in the whole warp (it can then keep what derives from it in uniform registers).
    const int warpgroup = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0) - 1;
    const int warp = int(threadIdx.x) % 128 / 32;       // inside the warpgroup
    const int lane = int(threadIdx.x) % 32;
    // wgmma accumulators: this thread holds rows fragment_row and fragment_row + 8 of its warp's
    // 16, columns 8i + fragment_column and one more.
    const int fragment_row = lane / 4;
    const int fragment_column = 2 * (lane % 4);
    const int warpgroup_row = warpgroup * 64;  // first row of this warpgroup inside the tile
    TIMELINE_BEGIN;  // the phase stamps (common/timeline.cuh): nothing unless measured

    if (threadIdx.x == 0) {
        for (int slot = 0; slot < SCHEDULE_SLOTS; ++slot) {
            mbarrier_init(&schedule_full[slot], 1);
            mbarrier_init(&schedule_empty[slot], CONSUMER_WARPS + 1);  // + the storer
        }
        for (int consumer = 0; consumer < CONSUMERS; ++consumer) {
            mbarrier_init(&q_full[consumer], 1);
            mbarrier_init(&q_empty[consumer], 4);
            mbarrier_init(&o_empty[consumer], 1);
        }
        for (int stage = 0; stage < STAGES; ++stage) {
            mbarrier_init(&k_full[stage], 1);
            mbarrier_init(&v_full[stage], 1);
            mbarrier_init(&k_empty[stage], CONSUMER_WARPS);
            mbarrier_init(&v_empty[stage], CONSUMER_WARPS);
        }
        for (int buffer = 0; buffer < O_BUFFERS; ++buffer) mbarrier_init(&o_full[buffer], 128);
        fence_barrier_init();
    }
    // excerpt: first-work
    // The block's first work tile, worked out by the storer's thread while thread 0 sets up the
    // barriers, and left in the schedule's first slot, where the loader finds it.
    if (threadIdx.x == 32)
        schedule[0] = work_item<Config>(int(blockIdx.x), total_tiles, whole_tiles, order, q_tiles, len_kv, causal);
    // end excerpt
    __syncthreads();

    // excerpt: next-work
    // The work tile of the block's round `round`, as the loader announced it. Every consumer
    // warp and the storer read each slot once and say so (the storer alone: `single`). In a
    // warp lane 0 alone reads the slot, before it frees it, and hands the tile to its lanes.
    auto next_work = [&](int round, bool single = false) {
        const int slot = round % SCHEDULE_SLOTS;
        WorkTile work{0, 0, 0, 0, WHOLE};
        if constexpr (ONE_TILE) {
            if (round == 0 && (single || lane == 0)) work = schedule[0];  // then no more
        } else {
            mbarrier_wait(&schedule_full[slot], uint32_t(round / SCHEDULE_SLOTS % 2));
            if (single || lane == 0) {
                work = schedule[slot];
                mbarrier_arrive(&schedule_empty[slot]);
            }
        }
        if (!single) {  // the same in the whole warp, and the compiler knows it (see warpgroup)
            work.head = __shfl_sync(FULL_MASK, work.head, 0);
            work.q_start = __shfl_sync(FULL_MASK, work.q_start, 0);
            work.kv_tiles = __shfl_sync(FULL_MASK, work.kv_tiles, 0);
            work.kv_begin = __shfl_sync(FULL_MASK, work.kv_begin, 0);
            work.part = __shfl_sync(FULL_MASK, work.part, 0);
        }
        if constexpr (!SPLITS) work.kv_begin = 0, work.part = WHOLE;
        return work;
    };
    // end excerpt

    if (warpgroup < 0) {
        setmaxnreg_dec<Config::PRODUCER_REGISTERS>();
        if (threadIdx.x == 0) {
            // The loader: for each work tile, it announces the tile, then walks its K/V tiles,
            // waiting until the stage it is about to fill has been released by every consumer
            // warp. Each consumer's rows of Q are loaded with the work tile's first K, once that
            // consumer's last S = Q K^T of the work tile before is done. On the first pass
            // through a ring the stages are free: waiting on the parity of the phase before the
            // first one returns at once. `load` counts every K/V tile the block has asked for. A
            // part of a split work tile loads from its kv_begin on; the loop counts K/V rows, not
            // tiles: at D = 64 the loader has 32 registers, and a tile index beside kv_begin
            // spilled one (as would gridDim.x, kept).
            TIMELINE_STAMP(TIMELINE_START, 0);
            // The work tile of round `round` into its slot, once every reader has read the one
            // before it there.
            auto announce = [&](const WorkTile& work, int round) {
                const int slot = round % SCHEDULE_SLOTS;
                mbarrier_wait(&schedule_empty[slot], uint32_t((round / SCHEDULE_SLOTS + 1) % 2));
                schedule[slot] = work;
                mbarrier_arrive(&schedule_full[slot]);
            };
            // excerpt: loader
            int tile = int(blockIdx.x), load = 0;
            for (int round = 0;; ++round) {
                const WorkTile work = round == 0 ? schedule[0]  // worked out before the barrier (first-work)
                                                 : work_item<Config>(tile, total_tiles, whole_tiles, order, q_tiles, len_kv, causal);
                if constexpr (!ONE_TILE) announce(work, round);  // (one tile: it is in the slot already)
                if (work.kv_tiles == 0) break;
                const int end = (work.kv_begin + work.kv_tiles) * BLOCK_KV;  // (a part: inside the range)
                bool first = true;
                for (int kv_row = work.kv_begin * BLOCK_KV; kv_row < end; kv_row += BLOCK_KV, ++load, first = false) {
                    const int stage = load % STAGES;
                    const uint32_t free_parity = (load / STAGES + 1) % 2;
                    mbarrier_wait(&k_empty[stage], free_parity);
                    mbarrier_arrive_expect_tx(&k_full[stage], Config::KV_BYTES);
                    for (int slab = 0; slab < SLABS; ++slab)
                        tma_load_3d(k_tiles + (stage * SLABS + slab) * BLOCK_KV * 64, &k_map, slab * 64,
                                    kv_row, work.head, &k_full[stage]);
                    if (first) {
                        for (int consumer = 0; consumer < CONSUMERS; ++consumer) {
                            mbarrier_wait(&q_empty[consumer], uint32_t((round + 1) % 2));
                            mbarrier_arrive_expect_tx(&q_full[consumer], Config::Q_ROWS_BYTES);
                            for (int slab = 0; slab < SLABS; ++slab)
                                tma_load_3d(q_tile + (slab * BLOCK_Q + consumer * 64) * 64, &q_map, slab * 64,
                                            work.q_start + consumer * 64, work.head, &q_full[consumer]);
                        }
                    }
                    mbarrier_wait(&v_empty[stage], free_parity);
                    mbarrier_arrive_expect_tx(&v_full[stage], Config::KV_BYTES);
                    for (int slab = 0; slab < SLABS; ++slab)
                        tma_load_3d(v_tiles + (stage * SLABS + slab) * BLOCK_KV * 64, &v_map, slab * 64,
                                    kv_row, work.head, &v_full[stage]);
                    TIMELINE_STAMP(TIMELINE_LOADED, load);
                }
                if constexpr (ONE_TILE) break;
                // The next work tile (the ring keeps the consumers busy while the atomic returns).
                unsigned blocks;
                asm volatile("mov.u32 %0, %%nctaid.x;\n" : "=r"(blocks));
                tile = int(blocks) + (tile_counter != nullptr ? atomicAdd(tile_counter, 1) : tile);
            }
            // end excerpt
            TIMELINE_STAMP(TIMELINE_END, load);
        } else if (threadIdx.x == 32) {
            // excerpt: storer
            // The storer: for each work tile and each consumer, in order, it waits until the
            // consumer has staged its O, stores the buffer with TMA (which writes only the rows
            // inside the tensor), and once the copy has read it, frees the buffer for the
            // consumer that uses it next.
            // A part of a split work tile leaves through the workspace, not through here: the
            // storer reads its slot and moves on. The o_full / o_empty phases count rounds on both
            // sides, which stays right because parts come only after every whole work tile of
            // the block (work_item): the rounds that stage O are the block's first ones, and no
            // phase is counted after the first part.
            for (int round = 0;; ++round) {
                const WorkTile work = next_work(round, true);
                if (work.kv_tiles == 0) break;
                if (work.part != WHOLE) continue;
                for (int consumer = 0; consumer < CONSUMERS; ++consumer) {
                    const int buffer = consumer % O_BUFFERS;
                    const int use = round * (CONSUMERS / O_BUFFERS) + consumer / O_BUFFERS;
                    mbarrier_wait(&o_full[buffer], uint32_t(use % 2));
                    for (int slab = 0; slab < SLABS; ++slab)
                        tma_store_3d(&o_map, o_tiles + (buffer * SLABS + slab) * 64 * 64, slab * 64,
                                     work.q_start + consumer * 64, work.head);
                    bulk_commit();
                    bulk_wait_read<0>();
                    mbarrier_arrive(&o_empty[(consumer + O_BUFFERS) % CONSUMERS]);
                }
            }
            // end excerpt
        }
        return;
    }
    setmaxnreg_inc<Config::CONSUMER_REGISTERS>();
    TIMELINE_STAMP(TIMELINE_START, 0);

    // Descriptors of the operands, built once: Q's for this warpgroup's rows, K's and V's for
    // stage 0. Q and K are K-major (the head dim is contiguous): k-step `step` is slab step / 4,
    // 32 bytes further along each row per step inside it. V is read as the MN-major B of O = P V:
    // k-step `step` is keys 16 step .. 16 step + 15, 2048 bytes down; the slabs of its head dim
    // are BLOCK_KV rows apart. A stage and a k-step move a descriptor by a constant number of
    // bytes, an addition to its start-address field (advance_descriptor). Everything here
    // derives from values the compiler knows to be the same across the warp (the warpgroup and
    // the work tile are read from lane 0), so the descriptors live in uniform registers: per
    // wgmma one uniform add, no move from ordinary registers (R2UR), nothing rebuilt per tile.
    const uint64_t q_descriptor = make_smem_descriptor(q_tile + warpgroup_row * 64, 16, 8 * SLAB_ROW_BYTES);
    const uint64_t k_descriptor = make_smem_descriptor(k_tiles, 16, 8 * SLAB_ROW_BYTES);
    const uint64_t v_descriptor = make_smem_descriptor(v_tiles, BLOCK_KV * SLAB_ROW_BYTES, 8 * SLAB_ROW_BYTES);
    constexpr uint32_t KV_STAGE_BYTES = Config::KV_BYTES;
    auto kmajor_step = [](int rows, int step) {
        return uint32_t((step / 4) * rows * SLAB_ROW_BYTES + (step % 4) * 32);
    };

    // The work tile at hand: its head and rows, how many K/V tiles it reads from which one on,
    // its workspace slot if it is a part (else WHOLE); and the slot of the work item whose O is
    // being finished (the one before, at its first K/V tile).
    int head = 0, q_start = 0, kv_tiles = 0, kv_begin = 0, part = WHOLE, finished_part = WHOLE;
    // Does a tile hold scores to hide: past len_kv, or above the diagonal?
    auto needs_mask = [&](int kv_start) {
        return !(kv_start + BLOCK_KV <= len_kv && !(causal && kv_start + BLOCK_KV - 1 > q_start + warpgroup_row));
    };
    // Masks the scores a tile can hide. Its first line is needs_mask's test written out: a call
    // to needs_mask there changes the schedule of the D = 64 kernel (lab notes 10).
    auto mask = [&](float (&s)[BLOCK_KV / 2], int kv_start) {
        if (kv_start + BLOCK_KV <= len_kv && !(causal && kv_start + BLOCK_KV - 1 > q_start + warpgroup_row))
            return;
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
    };

    float o_accumulator[HEAD_DIM / 2] = {};
    // Rows fragment_row ([0]) and fragment_row + 8 ([1]): m is the running max of the raw
    // scores, l this thread's share of the running sum (its columns only), summed over the quad
    // of threads that share the row once at the end.
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.0f, 0.0f};
    const float scale_log2 = scale * LOG2E;  // exp(scale * x) = 2^(x * scale * log2 e)

    // excerpt: lazy-rescale
    // At D = 128 the reference max moves lazily: while a row's max has grown by at most
    // RESCALE_BOUND (in log2 units) over it, it stays where it was and P reaches at most
    // 2^RESCALE_BOUND; where no row of the warp moves, rescale_o multiplies nothing (`rescale`
    // false). O, l and LSE = m scale + log l are the same with any reference up to the max.
    constexpr float RESCALE_BOUND = 8.0f;
    bool rescale = true;
    auto move_reference = [&](const float (&m_new)[2], float (&max_offset)[2], float (&alpha)[2]) {
        // (m - -inf and -inf - -inf fail the test: a row's first visible key always moves it)
        bool move[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) move[r] = !((m_new[r] - m[r]) * scale_log2 <= RESCALE_BOUND);
        rescale = __any_sync(FULL_MASK, move[0] || move[1]);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            if (rescale && move[r]) {
                max_offset[r] = m_new[r] == -INFINITY ? 0.0f : m_new[r] * scale_log2;
                alpha[r] = fast_exp2(m[r] * scale_log2 - max_offset[r]);
                m[r] = m_new[r];
                l[r] *= alpha[r];
            } else {
                max_offset[r] = m[r] * scale_log2;  // m[r] is finite: it did not move
                alpha[r] = 1.0f;
            }
        }
    };
    // end excerpt
    // Online softmax in FP32, in place: S becomes exp(scale * (S - m_new)); alpha is the factor
    // that moves O and l from the old running max to the new one.
    auto softmax = [&](float (&s)[BLOCK_KV / 2], float (&alpha)[2]) {
        float m_new[2] = {m[0], m[1]};
#pragma unroll
        for (int n = 0; n < BLOCK_KV / 8; ++n) {
            m_new[0] = fmaxf(m_new[0], fmaxf(s[4 * n + 0], s[4 * n + 1]));
            m_new[1] = fmaxf(m_new[1], fmaxf(s[4 * n + 2], s[4 * n + 3]));
        }
        float max_offset[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            m_new[r] = fmaxf(m_new[r], __shfl_xor_sync(FULL_MASK, m_new[r], 1));
            m_new[r] = fmaxf(m_new[r], __shfl_xor_sync(FULL_MASK, m_new[r], 2));
        }
        if constexpr (HEAD_DIM == 128) {
            move_reference(m_new, max_offset, alpha);
        } else {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                // A row with no visible key yet keeps max -inf: use 0, so no inf - inf.
                max_offset[r] = m_new[r] == -INFINITY ? 0.0f : m_new[r] * scale_log2;
                alpha[r] = fast_exp2(m[r] * scale_log2 - max_offset[r]);
                m[r] = m_new[r];
                l[r] *= alpha[r];
            }
        }
#pragma unroll
        for (int n = 0; n < BLOCK_KV / 8; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                s[4 * n + i] = fast_exp2(fmaf(s[4 * n + i], scale_log2, -max_offset[i / 2]));
                l[i / 2] += s[4 * n + i];
            }
    };
    // excerpt: softmax-both-arms
    // The main loop's softmax, after the mask where the tile needs one. At D = 128 the softmax is
    // called in both arms of the branch: with one call after it, ptxas moves the loop's second
    // wgmma wait up before the softmax. D = 64 keeps the one call: it is bound by the exponent
    // unit, and this form measured faster there.
    auto masked_softmax = [&](float (&s)[BLOCK_KV / 2], float (&alpha)[2], int kv_start) {
        if constexpr (HEAD_DIM == 128) {
            if (needs_mask(kv_start)) {
                mask(s, kv_start);
                softmax(s, alpha);
            } else {
                softmax(s, alpha);
            }
        } else {
            mask(s, kv_start);
            softmax(s, alpha);
        }
    };
    // end excerpt
    // P as bf16 A fragments: the accumulators of 8-column tiles 2k and 2k+1 are exactly the A
    // fragment of k-step k.
    uint32_t p[PV_STEPS][4];
    auto pack_p = [&](const float (&s)[BLOCK_KV / 2]) {
#pragma unroll
        for (int n = 0; n < BLOCK_KV / 8; ++n) {
            p[n / 2][(n % 2) * 2 + 0] = pack_bf16x2(s[4 * n + 0], s[4 * n + 1]);
            p[n / 2][(n % 2) * 2 + 1] = pack_bf16x2(s[4 * n + 2], s[4 * n + 3]);
        }
    };
    // At the first K/V tile of a work tile alpha is 0 (m was reset to -inf): the rescale then
    // clears O, which the epilogue of the work tile before has just stored.
    auto rescale_o = [&](const float (&alpha)[2]) {
        if (!rescale) return;
#pragma unroll
        for (int d = 0; d < HEAD_DIM / 8; ++d) {
            o_accumulator[4 * d + 0] *= alpha[0];
            o_accumulator[4 * d + 1] *= alpha[0];
            o_accumulator[4 * d + 2] *= alpha[1];
            o_accumulator[4 * d + 3] *= alpha[1];
        }
    };

    // S = Q K^T and O += P V, issued without waiting (the caller fences and commits).
    auto issue_s = [&](float (&s)[BLOCK_KV / 2], int stage) {
        const uint64_t k_stage = advance_descriptor(k_descriptor, stage * KV_STAGE_BYTES);
#pragma unroll
        for (int step = 0; step < QK_STEPS; ++step)
            Wgmma<BLOCK_KV>::template ss<0, 0>(s, advance_descriptor(q_descriptor, kmajor_step(BLOCK_Q, step)),
                                               advance_descriptor(k_stage, kmajor_step(BLOCK_KV, step)), step > 0);
    };
    auto issue_pv = [&](int stage) {
        const uint64_t v_stage = advance_descriptor(v_descriptor, stage * KV_STAGE_BYTES);
#pragma unroll
        for (int step = 0; step < PV_STEPS; ++step)
            Wgmma<HEAD_DIM>::template rs<1>(o_accumulator, p[step],
                                            advance_descriptor(v_stage, step * 16 * SLAB_ROW_BYTES), 1);
    };
    // One arrival per warp tells the producer that the stage's K (or V) may be refilled.
    auto release = [&](uint64_t* empty) {
        __syncwarp();
        if (lane == 0) mbarrier_arrive(empty);
    };
    // excerpt: turns
    // Ping-pong: the consumer warpgroups take turns at issuing their wgmma, so that while one
    // warpgroup's GEMMs run on the tensor cores the others compute their softmax. Warpgroup w
    // waits on named barrier TURN + w, which the warpgroup before it (w - 1, cyclically) arrives
    // at once it has issued. 256 threads: the 128 that wait and the 128 that arrive.
    constexpr int TURN = 1 + Config::CONSUMERS;  // ids 1 .. CONSUMERS are the epilogue's
    auto wait_turn = [&] { named_barrier_sync(TURN + warpgroup, 256); };
    auto pass_turn = [&] { named_barrier_arrive(TURN + (warpgroup + 1) % Config::CONSUMERS, 256); };
    // end excerpt
    auto parity = [](int kv_tile) { return uint32_t(kv_tile / STAGES % 2); };

    // The end of a work tile. Once its last softmax is done, m and l are final: finish l over
    // the quad, write LSE = m * scale + ln(l) from registers, keep 1 / l. Once its last P V is
    // done, O / l goes to this consumer's O buffer (as soon as the storer has freed it), in the
    // swizzled layout that TMA reads, and the storer stores it.
    auto finish_rows = [&](float (&inverse_sum)[2]) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float sum = l[r];
            sum += __shfl_xor_sync(FULL_MASK, sum, 1);
            sum += __shfl_xor_sync(FULL_MASK, sum, 2);
            inverse_sum[r] = 1.0f / sum;
            const int tile_row = warpgroup_row + warp * 16 + fragment_row + r * 8;
            const int row = q_start + tile_row;
            if (part != WHOLE) {  // a part's LSE goes to its slot, every row of the tile
                if (lane % 4 == 0) split_lse[int64_t(part) * BLOCK_Q + tile_row] = m[r] * scale + logf(sum);
            } else if (lse != nullptr && lane % 4 == 0 && row < len_q) {
                lse[int64_t(head) * len_q + row] = m[r] * scale + logf(sum);
            }
        }
    };
    // A part's O, normalized by its own l, in FP32 from registers to its workspace slot
    // [part][BLOCK_Q][HEAD_DIM]: the merge kernel weighs the parts by their LSE. Every row of the
    // tile is written (rows past len_q hold finite values: TMA filled their Q with zeros) and
    // the merge reads those inside the tensor only. Nothing goes to the storer.
    auto store_part = [&](const float (&inverse_sum)[2], int slot) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int tile_row = warpgroup_row + warp * 16 + fragment_row + r * 8;
            float* o_row = split_o + (int64_t(slot) * BLOCK_Q + tile_row) * HEAD_DIM + fragment_column;
#pragma unroll
            for (int d = 0; d < HEAD_DIM / 8; ++d)
                *reinterpret_cast<float2*>(o_row + 8 * d) =
                    make_float2(o_accumulator[4 * d + 2 * r] * inverse_sum[r],
                                o_accumulator[4 * d + 2 * r + 1] * inverse_sum[r]);
        }
    };

    // excerpt: o-empty
    auto stage_o = [&](const float (&inverse_sum)[2], int round) {
        const int buffer = warpgroup % O_BUFFERS;
        const int user = warpgroup / O_BUFFERS;  // 0: the buffer's first user in a round
        mbarrier_wait(&o_empty[warpgroup], uint32_t((user == 0 ? round + 1 : round) % 2));
    // end excerpt
        bf16* o_tile = o_tiles + buffer * SLABS * 64 * 64;  // slab s: + s * 64 * 64
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            // Column 8d + fragment_column is 16-byte chunk d % 8 of slab d / 8, and the swizzle
            // XORs the chunk with row % 8. A row starts on a 128-byte boundary, so both act on
            // address bits 4-6 alone: row_address ^ (d % 8) * 16, plus the slab's offset.
            // (refresh_register: else the compiler keeps those addresses alive across the
            // main loop, which has no registers to spare.)
            const int tile_row = warp * 16 + fragment_row + r * 8;  // inside the warpgroup's 64
            uint32_t row_address = smem_address(o_tile + tile_row * 64 + fragment_column) ^ ((tile_row % 8) * 16);
            refresh_register(row_address);
#pragma unroll
            for (int d = 0; d < HEAD_DIM / 8; ++d) {
                const __nv_bfloat162 pair = __floats2bfloat162_rn(o_accumulator[4 * d + 2 * r] * inverse_sum[r],
                                                                  o_accumulator[4 * d + 2 * r + 1] * inverse_sum[r]);
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"((row_address ^ ((d % 8) * 16)) + (d / 8) * 64 * 64 * 2),
                             "r"(*reinterpret_cast<const uint32_t*>(&pair))
                             : "memory");
            }
        }
        // excerpt: o-full
        // The copy engine reads what ordinary stores wrote: each thread fences, then arrives
        // (release) and the storer waits (acquire) before it issues the copy. Every thread
        // arrives, not each warp's lane 0 after a __syncwarp: compute-sanitizer's racecheck
        // follows an arrive to a wait, but not stores that __syncwarp orders before another
        // lane's arrive (lab notes 12).
        fence_proxy_async_shared();
        mbarrier_arrive(&o_full[buffer]);
        // end excerpt
    };
    // The O of a finished work item: whole, staged for the storer (its round counts the O
    // buffer's phases, as before: whole items are the block's first rounds); a part, to its
    // workspace slot, with no o_empty wait and no o_full arrival (the storer skips the round).
    auto finish_o = [&](const float (&inverse_sum)[2], int slot, int finished_round) {
        if (slot == WHOLE)
            stage_o(inverse_sum, finished_round);
        else
            store_part(inverse_sum, slot);
    };

    float s[BLOCK_KV / 2];
    float alpha[2];
    float inverse_sum[2];  // 1 / l of the work tile whose O is being finished
    int round = 0;
    WorkTile work = next_work(round);
    if (work.kv_tiles == 0) return;  // (a block always has a work tile: the grid is never larger)
    q_start = work.q_start;
    kv_tiles = work.kv_tiles;
    head = work.head;
    kv_begin = work.kv_begin;
    part = work.part;
    if (warpgroup == Config::CONSUMERS - 1) pass_turn();  // warpgroup 0 goes first

    // The block's first K/V tile: S_0 alone, then its softmax (O is still zero: nothing to rescale).
    mbarrier_wait(&q_full[warpgroup], 0);
    mbarrier_wait(&k_full[0], 0);
    TIMELINE_STAMP(TIMELINE_TILE_READY, 0);
    wait_turn();
    TIMELINE_STAMP(TIMELINE_TURN, 0);
    fence_registers(s);
    wgmma_fence();
    issue_s(s, 0);
    wgmma_commit();
    pass_turn();
    TIMELINE_STAMP(TIMELINE_ISSUED, 0);
    wgmma_wait<0>();
    TIMELINE_STAMP(TIMELINE_S_DONE, 0);
    fence_registers(s);
    release(&k_empty[0]);
    if (kv_tiles == 1) release(&q_empty[warpgroup]);
    mask(s, kv_begin * BLOCK_KV);
    softmax(s, alpha);
    TIMELINE_STAMP(TIMELINE_SOFTMAX_DONE, 0);
    pack_p(s);

    // excerpt: next-work-tile
    // At the block's K/V tile that starts a new work tile: the work tile before is done with
    // its softmax (LSE now, 1 / l kept for its O), m and l start again, the new rows' Q has landed.
    // False when the block has no more work.
    auto next_work_tile = [&] {
        finish_rows(inverse_sum);
        finished_part = part;
        const WorkTile next = next_work(++round);
        if (next.kv_tiles == 0) return false;
        head = next.head;
        q_start = next.q_start;
        kv_tiles = next.kv_tiles;
        kv_begin = next.kv_begin;
        part = next.part;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.0f;
        mbarrier_wait(&q_full[warpgroup], uint32_t(round % 2));
        return true;
    };
    // end excerpt

    // excerpt: step
    // K/V tile `kv_tile` of the work tile at hand, the block's `read`-th: S_j = Q K_j^T and
    // O += P_{j-1} V_{j-1} go to the tensor cores together, and the softmax of S_j runs between
    // the two waits (at D = 128; masked_softmax says why not at D = 64). `first`: K_j starts a
    // new work tile, and P_{j-1} V_{j-1} ends the one before, whose O is staged after it.
    auto step = [&](int kv_tile, int read, bool first) {
        const int stage = read % STAGES, previous = (read - 1) % STAGES;
        mbarrier_wait(&k_full[stage], parity(read));
        mbarrier_wait(&v_full[previous], parity(read - 1));
        TIMELINE_STAMP(TIMELINE_TILE_READY, read);
        wait_turn();
        TIMELINE_STAMP(TIMELINE_TURN, read);
        fence_registers(s);
        fence_registers(o_accumulator);
        wgmma_fence();
        issue_s(s, stage);
        wgmma_commit();
        issue_pv(previous);
        wgmma_commit();
        pass_turn();
        TIMELINE_STAMP(TIMELINE_ISSUED, read);
        wgmma_wait<1>();  // S_j is done; P_{j-1} V_{j-1} may still run
        TIMELINE_STAMP(TIMELINE_S_DONE, read);
        fence_registers(s);
        release(&k_empty[stage]);
        if (kv_tile == kv_tiles - 1) release(&q_empty[warpgroup]);  // the work tile's last S
        masked_softmax(s, alpha, (kv_begin + kv_tile) * BLOCK_KV);
        TIMELINE_STAMP(TIMELINE_SOFTMAX_DONE, read);
        wgmma_wait<0>();
        TIMELINE_STAMP(TIMELINE_PV_DONE, read - 1);
        fence_registers(o_accumulator);
        release(&v_empty[previous]);
        if (first) finish_o(inverse_sum, finished_part, round - 1);  // then the rescale by alpha = 0 clears O
        rescale_o(alpha);
        pack_p(s);
    };
    // end excerpt

    // excerpt: overlap-loop
    // The work tiles one after the other: inside one, the loop of the one-tile kernel; between
    // two, the step that starts the next while the last P V of the one before runs. `read`
    // counts the block's K/V tiles over all its work tiles (the ring's stage and parity).
    int read = 1;
    for (;;) {
        for (int kv_tile = 1; kv_tile < kv_tiles; ++kv_tile, ++read) step(kv_tile, read, false);
        if (!next_work_tile()) break;
        step(0, read, true);
        ++read;
    }
    // end excerpt

    // The block's last O += P V, and its last work tile's O. The last warpgroup passes no turn:
    // nobody waits for it any more.
    const int last = (read - 1) % STAGES;
    mbarrier_wait(&v_full[last], parity(read - 1));
    TIMELINE_STAMP(TIMELINE_TILE_READY, read);
    wait_turn();
    TIMELINE_STAMP(TIMELINE_TURN, read);
    fence_registers(o_accumulator);
    wgmma_fence();
    issue_pv(last);
    wgmma_commit();
    if (warpgroup != Config::CONSUMERS - 1) pass_turn();
    TIMELINE_STAMP(TIMELINE_ISSUED, read);
    wgmma_wait<0>();
    TIMELINE_STAMP(TIMELINE_PV_DONE, read - 1);
    fence_registers(o_accumulator);
    release(&v_empty[last]);
    finish_o(inverse_sum, finished_part, round - 1);
    TIMELINE_STAMP(TIMELINE_END, read);
}

// The merge of the split work tiles' parts, by the log-sum-exp rule (stage 03's merge of two
// partial softmaxes, over `parts` of them): for every row, LSE = log sum_p exp(LSE_p) and
// O = sum_p exp(LSE_p - LSE) O_p, where O_p is part p's O normalized by its own l. Block
// (split tile, row group): 128 threads, four columns each, HEAD_DIM / 4 threads a row.
// excerpt: merge
template <class Config>
__global__ void __launch_bounds__(128)
merge_parts_kernel(const float* __restrict__ split_o, const float* __restrict__ split_lse,
                   bf16* __restrict__ o, float* __restrict__ lse, const TileOrder order, int len_q,
                   int len_kv, int q_tiles, int whole_tiles) {
    constexpr int HEAD_DIM = Config::HEAD_DIM, BLOCK_Q = Config::BLOCK_Q;
    constexpr int ROW_THREADS = HEAD_DIM / 4;
    const int split_tile = int(blockIdx.x);
    const int tile_row = int(blockIdx.y) * (128 / ROW_THREADS) + int(threadIdx.x) / ROW_THREADS;
    const int column = int(threadIdx.x) % ROW_THREADS * 4;
    const WorkTile work =
        work_tile<Config>(whole_tiles + split_tile, order, q_tiles, len_kv, false);
    const int row = work.q_start + tile_row;
    if (tile_row >= BLOCK_Q || row >= len_q) return;
    const int parts = order.parts.value;
    const int64_t first = int64_t(split_tile) * parts;
    float max_lse = -INFINITY;
    for (int p = 0; p < parts; ++p) max_lse = fmaxf(max_lse, split_lse[(first + p) * BLOCK_Q + tile_row]);
    float sum = 0.0f;
    float4 merged = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int p = 0; p < parts; ++p) {
        const float weight = expf(split_lse[(first + p) * BLOCK_Q + tile_row] - max_lse);
        const float* part_row = split_o + ((first + p) * BLOCK_Q + tile_row) * HEAD_DIM;
        const float4 part = *reinterpret_cast<const float4*>(part_row + column);
        sum += weight;
        merged.x += weight * part.x;
        merged.y += weight * part.y;
        merged.z += weight * part.z;
        merged.w += weight * part.w;
    }
    const float inverse = 1.0f / sum;
    const __nv_bfloat162 low = __floats2bfloat162_rn(merged.x * inverse, merged.y * inverse);
    const __nv_bfloat162 high = __floats2bfloat162_rn(merged.z * inverse, merged.w * inverse);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&low);
    packed.y = *reinterpret_cast<const uint32_t*>(&high);
    *reinterpret_cast<uint2*>(o + (int64_t(work.head) * len_q + row) * HEAD_DIM + column) = packed;
    if (lse != nullptr && column == 0) lse[int64_t(work.head) * len_q + row] = max_lse + logf(sum);
}
// end excerpt

// Whether a call's blocks take their work tiles from a counter (one int the launcher zeroes
// before the launch) rather than at a fixed stride. Causal work tiles differ in length: from four
// per SM on, the counter balances them. Non-causal ones are alike, but a block can start late,
// when another kernel holds its SM (NCCL's, beside the forward in stage 13's ring): at a fixed
// stride the call then waits for that block's share, from the counter the block takes fewer. From
// sixteen work tiles per SM on, where the zeroing's few microseconds are a small fraction of the call.
inline bool counted(bool causal, int64_t tiles, int multiprocessors) {
    return tiles >= int64_t(causal ? 4 : 16) * multiprocessors;
}

// The SMs of the current device: the persistent grid's size and the split plan's S.
int multiprocessor_count() {
    int device = 0, multiprocessors = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
    return multiprocessors;
}

// The split of a non-causal shape's last round (split_plan.h) with the configuration's tiles;
// causal work tiles are never split (their counter balances them).
template <class Config>
SplitPlan split_plan(const AttentionShape& shape, int multiprocessors) {
    const int64_t tiles = int64_t(ceil_div(shape.len_q, Config::BLOCK_Q)) * shape.batch * shape.heads;
    if (!splits<Config> || shape.causal || tiles > INT_MAX) return SplitPlan{int(std::min<int64_t>(tiles, INT_MAX)), 0, 1};
    return plan_split(int(tiles), multiprocessors, ceil_div(shape.len_kv, Config::BLOCK_KV));
}
// The parts' workspace: O [part][BLOCK_Q][HEAD_DIM] then LSE [part][BLOCK_Q], FP32.
template <class Config>
size_t split_bytes(const SplitPlan& plan) {
    if (!plan.split()) return 0;
    return saturating_product({size_t(plan.split_tiles), size_t(plan.parts), size_t(Config::BLOCK_Q),
                               size_t(Config::HEAD_DIM + 1), sizeof(float)});
}

// The non-causal workspace of a shape: its split's parts, then the counter where the call takes
// its tiles from one. A shape of more than 2^31 - 1 work tiles, which the launcher refuses,
// reports what a split of it could take at most (S - 1 work tiles in parts of two K/V tiles) and
// the counter, saturated: never less than a smaller shape's, never wrapped.
template <class Config>
size_t workspace_bytes(const AttentionShape& shape, int multiprocessors) {
    const int64_t tiles = int64_t(ceil_div(shape.len_q, Config::BLOCK_Q)) * shape.batch * shape.heads;
    const size_t counter = counted(false, tiles, multiprocessors) ? sizeof(int) : 0;
    if (tiles <= INT_MAX) return split_bytes<Config>(split_plan<Config>(shape, multiprocessors)) + counter;
    const size_t parts = saturating_product({size_t(multiprocessors - 1), size_t(ceil_div(shape.len_kv, Config::BLOCK_KV) / 2),
                                             size_t(Config::BLOCK_Q), size_t(Config::HEAD_DIM + 1), sizeof(float)});
    return parts > SIZE_MAX - counter ? SIZE_MAX : parts + counter;
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
    const int64_t tiles = int64_t(q_tiles) * batch_heads;
    if (tiles > INT_MAX)
        throw std::invalid_argument("attention: batch * heads * ceil(len_q / " +
                                    std::to_string(Config::BLOCK_Q) + ") = " +
                                    std::to_string(tiles) +
                                    " is not allowed: must be at most 2^31 - 1");
    // excerpt: grid
    // Persistent: one block per SM (its registers admit no second one), or one per work
    // tile where there are fewer. Causal work tiles differ in length: there the blocks take the
    // next tile from a counter, zeroed before the launch, so that a block that finishes early
    // takes more (longest first, as the hardware hands out the blocks of an ordinary grid). The
    // zeroing is one more operation in the stream (a few microseconds): below four work tiles
    // per SM a causal call keeps the one-tile grid, whose blocks the hardware hands out so.
    // Long non-causal calls take the counter too, so that a block that starts late takes fewer
    // tiles (`counted`).
    const int multiprocessors = multiprocessor_count();
    const bool counter = counted(shape.causal, tiles, multiprocessors);
    // Non-causal, the last round's work tiles may be split along K/V (split_plan.h): F whole
    // work tiles, then r * g parts, whose partial O and LSE the workspace holds.
    const SplitPlan plan = split_plan<Config>(shape, multiprocessors);
    const int64_t items = plan.items();
    const int blocks = int(shape.causal && !counter ? tiles : std::min<int64_t>(items, multiprocessors));
    const size_t parts_bytes = split_bytes<Config>(plan);
    Workspace workspace(parts_bytes + (counter ? sizeof(int) : 0), stream);
    int* tile_counter = counter ? reinterpret_cast<int*>(workspace.as<char>() + parts_bytes) : nullptr;
    if (counter) CUDA_CHECK(cudaMemsetAsync(tile_counter, 0, sizeof(int), stream));
    // end excerpt
    float* split_o = plan.split() ? workspace.as<float>() : nullptr;
    const size_t split_o_floats = size_t(plan.split_tiles) * plan.parts * Config::BLOCK_Q * Config::HEAD_DIM;
    float* split_lse = plan.split() ? split_o + split_o_floats : nullptr;
    const TileOrder order = make_tile_order(batch_heads, heads_per_l2_group(shape), q_tiles, plan.parts,
                                            ceil_div(shape.len_kv, Config::BLOCK_KV));
    const CUtensorMap q_map = make_tensor_map(q, batch_heads, shape.len_q, Config::HEAD_DIM, 64);
    const CUtensorMap k_map = make_tensor_map(k, batch_heads, shape.len_kv, Config::HEAD_DIM, Config::BLOCK_KV);
    const CUtensorMap v_map = make_tensor_map(v, batch_heads, shape.len_kv, Config::HEAD_DIM, Config::BLOCK_KV);
    const CUtensorMap o_map = make_tensor_map(o, batch_heads, shape.len_q, Config::HEAD_DIM, 64);
    // excerpt: one-tile
    // A block for every work tile: the instance without the ring's slot (ONE_TILE).
    auto kernel = blocks == items ? flash_forward_pingpong_kernel<Config, true>
                                  : flash_forward_pingpong_kernel<Config, false>;
    // end excerpt
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(Config::SHARED_BYTES)));
    kernel<<<unsigned(blocks), Config::THREADS, Config::SHARED_BYTES, stream>>>(
        q_map, k_map, v_map, o_map, lse, tile_counter, split_o, split_lse,
        order, shape.len_q, shape.len_kv, q_tiles, int(items), plan.whole, shape.softmax_scale(), shape.causal);
    CUDA_CHECK_LAUNCH();
    if (plan.split()) {
        constexpr int ROWS_PER_BLOCK = 128 / (Config::HEAD_DIM / 4);
        const dim3 merge_grid(unsigned(plan.split_tiles), unsigned(ceil_div(Config::BLOCK_Q, ROWS_PER_BLOCK)));
        merge_parts_kernel<Config><<<merge_grid, 128, 0, stream>>>(
            split_o, split_lse, o, lse, order, shape.len_q, shape.len_kv, q_tiles, plan.whole);
        CUDA_CHECK_LAUNCH();
    }
}

}  // namespace

const StageCapabilities& stage_capabilities() {
    // 16-byte alignment: TMA needs the tensors' base addresses on 16-byte boundaries.
    // Compute capability 9.0: wgmma and TMA exist on Hopper only.
    static const StageCapabilities caps{"12_persistent", "bf16", {64, 128}, MAX_LENGTH,
                                        MAX_LENGTH, true, false, 16, 90};
    return caps;
}

// Causal: the kernel's tile counter (one int), whether or not a shape has enough tiles to use
// it. Non-causal: the split work tiles' partial O and LSE (zero where nothing is split) and the
// counter of a long call, which depend on the device's SMs; with no device visible (CI), those of
// an H100 SXM (132).
size_t attention_workspace_bytes(const AttentionShape& shape) {
    if (shape.causal) return sizeof(int);
    if (shape.head_dim != 64 && shape.head_dim != 128) return 0;
    int device = 0, multiprocessors = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the error: no device is no failure here
        multiprocessors = 132;
    }
    return shape.head_dim == 64 ? workspace_bytes<Tiling64>(shape, multiprocessors)
                                : workspace_bytes<Tiling128>(shape, multiprocessors);
}

void attention_forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                       const AttentionShape& shape, cudaStream_t stream) {
    validate_forward(shape, stage_capabilities(), q, k, v, o, lse);
    if (shape.head_dim == 64)
        launch<Tiling64>(q, k, v, o, lse, shape, stream);
    else if (shape.causal)
        launch<Tiling128Causal>(q, k, v, o, lse, shape, stream);
    else
        launch<Tiling128>(q, k, v, o, lse, shape, stream);
}
