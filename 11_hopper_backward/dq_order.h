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
    // Block b's place in tile t's chain: how many blocks add into t before it.
    DQ_ORDER_FN uint32_t turn(int b, int t) const {
        if (causal) {
            const int last = t / blocks_per_q_tile;  // B(t)
            return uint32_t((last < kv_tiles - 1 ? last : kv_tiles - 1) - b);
        }
        if (!rotate) return uint32_t(b);
        const int s = t / spacing();
        const int first = s < kv_tiles - 1 ? s : kv_tiles - 1;
        return uint32_t(first >= b ? first - b : first - b + kv_tiles);
    }
    // The key block of the block that claimed `index` within its head (0 = the first to start).
    DQ_ORDER_FN int key_block_of_claim(int index) const { return causal ? kv_tiles - 1 - index : index; }
};

// The launcher's choice of DqOrder::rotate: non-causal, more than one key block, at least as many
// query tiles as key blocks (each walk starts on a tile of its own), and every block of a head
// resident at once (`resident_blocks`: SMs times blocks per SM).
inline bool rotate_dq_chains(int kv_tiles, int q_tiles, bool causal, int64_t resident_blocks) {
    return !causal && kv_tiles > 1 && kv_tiles <= q_tiles && int64_t(kv_tiles) <= resident_blocks;
}

#undef DQ_ORDER_FN
