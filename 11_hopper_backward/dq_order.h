// Deterministic mode: the order in which the key blocks of one head add their pieces of dQ into
// a query tile, and the order in which each block walks its query tiles. Any fixed order per
// tile gives the same bits run to run; this one is chosen so that the blocks reach every tile in
// the order of its chain, one after another, instead of all at once (lab notes 11, "The order").
//
// Non-causal, every block sees every query tile. With `rotate`, block b starts its walk at tile
// start(b) = b spacing, spacing = floor(q_tiles / kv_tiles) >= 1, and goes round, and tile t's
// chain takes the blocks in the order they reach it: s(t), s(t) - 1, ..., 0, kv_tiles - 1, ...,
// s(t) + 1, where s(t) = min(t / spacing, kv_tiles - 1) is the last block whose walk starts at
// or before t. Each block's predecessor in a chain is the block above it (block 0's is the
// last), so a block can wait for one that has not started: the launcher rotates only where
// every block of a head can be resident at once and there are at least as many query tiles as
// key blocks, and the blocks claim their (head, key block) head by head.
//
// Without `rotate`, every block walks from tile 0 and the chain goes 0, 1, 2, ...: a block waits
// only for blocks that claimed their index before it, whatever the GPU can hold.
//
// Causal (keys up to the query's own position), block b sees the tiles from
// first(b) = b BLOCK_KV / BLOCK_Q on, so the block with the highest index reaches a tile first:
// tile t's chain is B(t), B(t) - 1, ..., 0, with B(t) the last block that sees t. The blocks
// claim their key block from the top down, so that here too a block waits only for blocks that
// claimed before it.
//
// Two chains per tile (`chains` = 2): the even and the odd key blocks add into accumulators of
// their own, each in the order above, and a last pass adds the two (even first). A block's
// predecessor in its chain then reaches the tile two steps before it where one chain would give
// one: the time a link takes (the wait for the turn, the add to completion, the release) has
// two steps to hide in. The launcher takes two wherever one chain would have less.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DQ_ORDER_FN __host__ __device__ __forceinline__
#else
#define DQ_ORDER_FN inline
#endif

struct DqOrder {
    int kv_tiles = 1;
    int q_tiles = 1;
    int blocks_per_q_tile = 1;  // BLOCK_KV / BLOCK_Q: 1 at D = 64, 2 at D = 128
    bool causal = false;
    bool rotate = false;        // non-causal only, and kv_tiles <= q_tiles
    int chains = 1;             // 1 to MAX_CHAINS: block b adds into chain b % chains

    // The first query tile that sees any of block b's keys (causal), or 0.
    DQ_ORDER_FN int first_tile(int b) const {
        if (!causal) return 0;
        const int first = b * blocks_per_q_tile;  // both below 2^24 (kv_tiles, q_tiles)
        return first < q_tiles ? first : q_tiles;
    }
    // How many query tiles block b visits.
    DQ_ORDER_FN int walk_length(int b) const { return q_tiles - first_tile(b); }
    // Query tiles between the starts of two blocks' walks (rotate).
    DQ_ORDER_FN int spacing() const { return q_tiles / kv_tiles; }
    DQ_ORDER_FN int walk_start(int b) const { return rotate ? b * spacing() : first_tile(b); }
    // The query tile of step `step` of block b's walk (0 <= step < walk_length(b)).
    DQ_ORDER_FN int tile_at(int b, int step) const {
        const int tile = walk_start(b) + step;
        return rotate && tile >= q_tiles ? tile - q_tiles : tile;
    }
    // excerpt: dq-turn
    DQ_ORDER_FN int chain_of(int b) const { return b % chains; }
    // Block b's place in tile t's chain (its own of `chains`): how many blocks of its chain add
    // into t before it. Counted over every block, the place is r; the blocks before b are the
    // r blocks above it (causal: b + 1 .. B(t); rotated: b + 1, b + 2, ... round to s(t)) or, in
    // the plain order, the b below it; of those, the ones of b's chain are every chains-th.
    DQ_ORDER_FN uint32_t turn(int b, int t) const {
        if (!causal && !rotate) return uint32_t(b / chains);
        int r;
        if (causal) {
            const int last = t / blocks_per_q_tile;  // B(t)
            r = (last < kv_tiles - 1 ? last : kv_tiles - 1) - b;
        } else {
            const int s = t / spacing();
            const int first = s < kv_tiles - 1 ? s : kv_tiles - 1;
            r = first >= b ? first - b : first - b + kv_tiles;
        }
        if (b + r < kv_tiles) return uint32_t(r / chains);
        // Rotated past the last block: b + 1 .. kv_tiles - 1, then 0 .. b + r - kv_tiles.
        const int wrapped = b + r - kv_tiles, residue = b % chains;
        return uint32_t((kv_tiles - 1 - b) / chains + (wrapped >= residue ? (wrapped - residue) / chains + 1 : 0));
    }
    // end excerpt
    // The key block of the block that claimed `index` within its head (0 = the first to start).
    DQ_ORDER_FN int key_block_of_claim(int index) const { return causal ? kv_tiles - 1 - index : index; }
};

// The launcher's choice of DqOrder::rotate: non-causal, more than one key block, at least as many
// query tiles as key blocks (each walk starts on a tile of its own), and every block of a head
// resident at once (`resident_blocks`: SMs times blocks per SM).
inline bool rotate_dq_chains(int kv_tiles, int q_tiles, bool causal, int64_t resident_blocks) {
    return !causal && kv_tiles > 1 && kv_tiles <= q_tiles && int64_t(kv_tiles) <= resident_blocks;
}

// And of DqOrder::chains: enough that a block's predecessor in its chain reached the tile at
// least LINK_STEPS steps of the walk before it (time for a link: the writer's acquire, the add
// waited on to completion, the release), at most MAX_CHAINS: each chain beyond the first is an
// accumulator more to zero and to read in the conversion. With LINK_STEPS = 2: two chains where
// one would give a single step (rotated with fewer than two query tiles per key block, causal at
// D = 64), one where it gives two already, or for a single key block. Measured on the H100,
// LINK_STEPS = 3 and 4 (three or four chains at the headline and at D = 64, two causal at
// D = 128) were 2-6% slower than 2: an accumulator more costs more than the longer link saves
// (lab notes 11, docs/profiles/11_hopper_backward/det-chains-h100.txt).
// A function of the shape alone (the workspace holds the chains' accumulators), not of `rotate`:
// unrotated, fewer than two query tiles per key block counts as one step too.
constexpr int LINK_STEPS = 2, MAX_CHAINS = 4;
inline int dq_chain_count(int kv_tiles, int q_tiles, bool causal, int blocks_per_q_tile) {
    if (kv_tiles < 2) return 1;
    const int steps = causal ? blocks_per_q_tile : (q_tiles / kv_tiles > 1 ? q_tiles / kv_tiles : 1);
    const int chains = (LINK_STEPS + steps - 1) / steps;
    return chains < MAX_CHAINS ? chains : MAX_CHAINS;
}

#undef DQ_ORDER_FN
