// A measured timeline of a Hopper kernel's warpgroups: when each one waited, issued, computed,
// tile by tile. The stages mark their phases with TIMELINE_STAMP; unless ATTENTION_TIMELINE is
// defined (only bench/experiments/timeline.cu defines it) the marks expand to nothing, and the
// stage compiles to the same SASS as without them.
//
// With it, one thread of each warpgroup of TIMELINE_BLOCKS blocks (the first ones, or from
// timeline_first_block on) writes the SM's cycle
// counter (clock64: one clock for every warp of a block), the GPU's nanosecond timer, the event
// and the tile into
// timeline_records[block][warpgroup + 1][n], n counting that warpgroup's stamps (the producer,
// warpgroup -1, is slot 0; stage 11's dQ writer, when its stamps are patched in, the last). The
// stores are fire-and-forget: a stamp costs a clock read and a store, no atomic and no wait.
#pragma once

// The phases, in the order a consumer meets them in a tile.
enum TimelineEvent : int {
    TIMELINE_START = 0,     // the warpgroup starts work (after setmaxnreg)
    TIMELINE_LOADED,        // producer: the tile's TMA loads are issued
    TIMELINE_TILE_READY,    // consumer: the tile's K (and the previous V) have landed
    TIMELINE_TURN,          // its turn to issue wgmma has come
    TIMELINE_ISSUED,        // its GEMMs are issued and the turn passed on
    TIMELINE_S_DONE,        // wgmma.wait_group returned S_j
    TIMELINE_SOFTMAX_DONE,  // the softmax of S_j is written (P_j in registers)
    TIMELINE_PV_DONE,       // wgmma.wait_group 0 returned: O += P_{j-1} V_{j-1} is done
    TIMELINE_END,           // O is stored (consumer) or the last load issued (producer)
    // Stage 11's backward, per query tile, after TILE_READY (Q, dO, LSE and delta have landed),
    // TURN (the first turn), ISSUED (S^T and dP^T issued, the turn passed on) and S_DONE (S^T):
    TIMELINE_P_DONE,            // P^T = exp(S^T - LSE) is in registers
    TIMELINE_DP_DONE,           // wgmma.wait_group 0 returned dP^T
    TIMELINE_DS_STORED,         // dS^T is computed and stored to shared memory for dQ
    TIMELINE_GRADIENTS_TURN,    // the second turn has come
    TIMELINE_GRADIENTS_ISSUED,  // dK, dV and a piece of dQ are issued and the turn passed on
    TIMELINE_GRADIENTS_DONE,    // wgmma.wait_group 0 returned them and the stage is released
    TIMELINE_DQ_HANDED,         // the piece of dQ is staged and its bulk reduce-add issued
    // Stage 11's dQ writer of consumer 0 (write_dq), per query tile, in slot TIMELINE_WRITER_SLOT
    // (the CSV's warpgroup -2), stamped by the lab notes' writer-stamps.patch; the turn and its
    // release belonged to the deterministic mode's chains of adds, which fixed-point sums replaced:
    TIMELINE_DQ_TURN,           // the tile's turn has come (deterministic: the semaphore said so)
    TIMELINE_DQ_STAGED,         // the consumer's piece is staged (the writer's mbarrier wait returned)
    TIMELINE_DQ_READ,           // the reduce-adds are issued and have read the staging tile
    TIMELINE_DQ_RELEASED,       // deterministic: the adds are complete and the turn passed on
    TIMELINE_EVENTS
};

#ifdef ATTENTION_TIMELINE
// (An experiment's build may stamp more blocks with fewer stamps each: TIMELINE_BLOCKS_N,
// TIMELINE_STAMPS_N.)
#ifndef TIMELINE_BLOCKS_N
#define TIMELINE_BLOCKS_N 4
#endif
#ifndef TIMELINE_STAMPS_N
#define TIMELINE_STAMPS_N 4096
#endif
constexpr int TIMELINE_BLOCKS = TIMELINE_BLOCKS_N;  // blocks of the grid that stamp: one per SM
constexpr int TIMELINE_WARPGROUPS = 4;              // the producer and up to three consumers
constexpr int TIMELINE_STAMPS = TIMELINE_STAMPS_N;  // per warpgroup: 4096, enough for 500 tiles

struct TimelineStamp {
    long long cycle;       // clock64: the SM's cycles
    long long nanoseconds; // %globaltimer: the GPU's clock in ns, coarser, to turn cycles into time
    int event;
    int tile;
};
__device__ TimelineStamp timeline_records[TIMELINE_BLOCKS][TIMELINE_WARPGROUPS][TIMELINE_STAMPS];
__device__ int timeline_counts[TIMELINE_BLOCKS][TIMELINE_WARPGROUPS];
// The first of the stamped blocks (0 unless the program sets it): blocks first ..
// first + TIMELINE_BLOCKS - 1 stamp, into records 0 .. TIMELINE_BLOCKS - 1.
__device__ int timeline_first_block;

// `block`: the block's record, blockIdx.x - timeline_first_block, read once by TIMELINE_BEGIN (a
// load at every stamp would lengthen the phases it measures).
__device__ __forceinline__ void timeline_stamp(int& count, int block, int warpgroup, int event, int tile) {
    if (block < 0 || block >= TIMELINE_BLOCKS || threadIdx.x % 128 != 0) return;
    long long cycle, nanoseconds;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(cycle) : : "memory");
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(nanoseconds) : : "memory");
    const int slot = warpgroup + 1;
    if (count < TIMELINE_STAMPS)
        timeline_records[block][slot][count] = TimelineStamp{cycle, nanoseconds, event, tile};
    timeline_counts[block][slot] = ++count;
}

// The slot of stage 11's dQ writer thread (lane 0 of a producer warp, not a warpgroup's first
// thread): the fourth, which the backward's two consumers leave free.
constexpr int TIMELINE_WRITER_SLOT = TIMELINE_WARPGROUPS - 1;
__device__ __forceinline__ void timeline_stamp_writer(int& count, int block, int event, int tile) {
    if (block < 0 || block >= TIMELINE_BLOCKS) return;
    long long cycle, nanoseconds;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(cycle) : : "memory");
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(nanoseconds) : : "memory");
    if (count < TIMELINE_STAMPS)
        timeline_records[block][TIMELINE_WRITER_SLOT][count] = TimelineStamp{cycle, nanoseconds, event, tile};
    timeline_counts[block][TIMELINE_WRITER_SLOT] = ++count;
}

// Declares the warpgroup's stamp counter; then TIMELINE_STAMP(event, tile) at each phase.
#define TIMELINE_BEGIN \
    int timeline_count = 0;  \
    const int timeline_block = int(blockIdx.x) - timeline_first_block
#define TIMELINE_STAMP(event, tile) timeline_stamp(timeline_count, timeline_block, warpgroup, (event), (tile))
// The same where the warpgroup is not a variable named `warpgroup` (stage 11's role functions).
#define TIMELINE_STAMP_AS(warpgroup_of, event, tile) \
    timeline_stamp(timeline_count, timeline_block, (warpgroup_of), (event), (tile))
// A dQ writer's stamp: consumer 0's writer only, the one thread that calls it.
#define TIMELINE_STAMP_WRITER(consumer, event, tile) \
    if ((consumer) == 0) timeline_stamp_writer(timeline_count, timeline_block, (event), (tile))
#else
#define TIMELINE_BEGIN
#define TIMELINE_STAMP(event, tile)
#define TIMELINE_STAMP_AS(warpgroup_of, event, tile)
#define TIMELINE_STAMP_WRITER(consumer, event, tile)
#endif
