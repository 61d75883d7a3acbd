// A measured timeline of a Hopper kernel's warpgroups: when each one waited, issued, computed,
// tile by tile. The stages mark their phases with TIMELINE_STAMP; unless ATTENTION_TIMELINE is
// defined (only bench/experiments/timeline.cu defines it) the marks expand to nothing, and the
// stage compiles to the same SASS as without them.
//
// With it, one thread of each warpgroup of the first TIMELINE_BLOCKS blocks writes the SM's cycle
// counter (clock64: one clock for every warp of a block), the GPU's nanosecond timer, the event
// and the tile into
// timeline_records[block][warpgroup + 1][n], n counting that warpgroup's stamps (the producer,
// warpgroup -1, is slot 0). The stores are fire-and-forget: a stamp costs a clock read and a
// store, no atomic and no wait.
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
    TIMELINE_EVENTS
};

#ifdef ATTENTION_TIMELINE
constexpr int TIMELINE_BLOCKS = 4;      // the first blocks of the grid: one per SM
constexpr int TIMELINE_WARPGROUPS = 4;  // the producer and up to three consumers
constexpr int TIMELINE_STAMPS = 4096;   // per warpgroup: enough for 500 tiles

struct TimelineStamp {
    long long cycle;       // clock64: the SM's cycles
    long long nanoseconds; // %globaltimer: the GPU's clock in ns, coarser, to turn cycles into time
    int event;
    int tile;
};
__device__ TimelineStamp timeline_records[TIMELINE_BLOCKS][TIMELINE_WARPGROUPS][TIMELINE_STAMPS];
__device__ int timeline_counts[TIMELINE_BLOCKS][TIMELINE_WARPGROUPS];

__device__ __forceinline__ void timeline_stamp(int& count, int warpgroup, int event, int tile) {
    if (blockIdx.x >= TIMELINE_BLOCKS || threadIdx.x % 128 != 0) return;
    long long cycle, nanoseconds;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(cycle) : : "memory");
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(nanoseconds) : : "memory");
    const int slot = warpgroup + 1;
    if (count < TIMELINE_STAMPS)
        timeline_records[blockIdx.x][slot][count] = TimelineStamp{cycle, nanoseconds, event, tile};
    timeline_counts[blockIdx.x][slot] = ++count;
}

// Declares the warpgroup's stamp counter; then TIMELINE_STAMP(event, tile) at each phase.
#define TIMELINE_BEGIN int timeline_count = 0
#define TIMELINE_STAMP(event, tile) timeline_stamp(timeline_count, warpgroup, (event), (tile))
// The same where the warpgroup is not a variable named `warpgroup` (stage 11's role functions).
#define TIMELINE_STAMP_AS(warpgroup_of, event, tile) \
    timeline_stamp(timeline_count, (warpgroup_of), (event), (tile))
#else
#define TIMELINE_BEGIN
#define TIMELINE_STAMP(event, tile)
#define TIMELINE_STAMP_AS(warpgroup_of, event, tile)
#endif
