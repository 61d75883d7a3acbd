// The cases only stage 11's deterministic backward has: the order of its dQ chains
// (dq_order.h), checked on the host for every arrangement the launcher can pick. The GPU cases
// of the mode are the shared suite's (common/test_backward.cpp), whose shapes reach both orders.
#include <algorithm>
#include <vector>

#include "dq_order.h"
#include "test_support.h"

namespace {

// Every (block, step) of every walk of one head, simulated: each block visits each query tile
// it sees exactly once, the blocks of a tile's chain take the turns 0 .. n - 1, and a lower turn
// never reaches the tile at a later step than a higher one. Where a block can wait for one that
// claimed its index later (the rotated order), a chain's predecessor reaches the tile at least a
// step before (so no link waits for another in step); elsewhere every predecessor claimed first.
void check_order(const DqOrder& order) {
    INFO("kv_tiles=", order.kv_tiles, " q_tiles=", order.q_tiles, " blocks_per_q_tile=", order.blocks_per_q_tile,
         " causal=", order.causal, " rotate=", order.rotate, " chains=", order.chains);
    struct Visit {
        int block, step;
        uint32_t turn;
    };
    // visits[tile * chains + chain]
    std::vector<std::vector<Visit>> visits(size_t(order.q_tiles) * size_t(order.chains));
    std::vector<int> claim_of_block(size_t(order.kv_tiles), -1);
    for (int index = 0; index < order.kv_tiles; ++index) {
        const int block = order.key_block_of_claim(index);
        REQUIRE(block >= 0);
        REQUIRE(block < order.kv_tiles);
        REQUIRE(claim_of_block[size_t(block)] == -1);
        claim_of_block[size_t(block)] = index;
    }
    for (int block = 0; block < order.kv_tiles; ++block) {
        std::vector<bool> seen(size_t(order.q_tiles), false);
        for (int step = 0; step < order.walk_length(block); ++step) {
            const int tile = order.tile_at(block, step);
            REQUIRE(tile >= order.first_tile(block));
            REQUIRE(tile < order.q_tiles);
            REQUIRE_FALSE(seen[size_t(tile)]);
            seen[size_t(tile)] = true;
            visits[size_t(tile) * size_t(order.chains) + size_t(order.chain_of(block))].push_back(
                {block, step, order.turn(block, tile)});
        }
        // Causal: a block sees tile t iff its first key is at or before the tile's last query.
        if (order.causal)
            for (int tile = 0; tile < order.q_tiles; ++tile)
                CHECK(seen[size_t(tile)] == (block * order.blocks_per_q_tile <= tile));
    }
    for (size_t index = 0; index < visits.size(); ++index) {
        const int tile = int(index) / order.chains;
        std::vector<Visit>& chain = visits[index];
        std::sort(chain.begin(), chain.end(), [](const Visit& a, const Visit& b) { return a.turn < b.turn; });
        for (size_t i = 0; i < chain.size(); ++i) {
            INFO("tile ", tile, " turn ", i, " block ", chain[i].block);
            REQUIRE(chain[i].turn == uint32_t(i));
            if (i == 0) continue;
            const Visit& before = chain[i - 1];
            CHECK(before.step <= chain[i].step);
            if (order.rotate) {
                CHECK(before.step < chain[i].step);
                // c chains: c steps apart at least, but where the rotation passes the last block
                // of a count that c does not divide (once per tile).
                if (order.kv_tiles % order.chains == 0) CHECK(chain[i].step - before.step >= order.chains);
            } else if (order.causal) {
                CHECK(claim_of_block[size_t(before.block)] < claim_of_block[size_t(chain[i].block)]);
                CHECK(chain[i].step - before.step >= order.chains * order.blocks_per_q_tile);
            } else
                CHECK(claim_of_block[size_t(before.block)] < claim_of_block[size_t(chain[i].block)]);
        }
    }
}

}  // namespace

TEST_CASE("11: the order of the dQ chains: each tile's blocks take turns 0 .. n - 1 in the order they reach it") {
    for (int blocks_per_q_tile : {1, 2})
        for (int kv_tiles : {1, 2, 3, 7, 8, 64, 133})
            for (int q_tiles : {1, 2, 5, 8, 9, 64, 65, 127, 128, 300})
                for (int chains : {1, 2, 3, 4}) {
                    check_order(DqOrder{kv_tiles, q_tiles, blocks_per_q_tile, /*causal=*/true, false, chains});
                    check_order(DqOrder{kv_tiles, q_tiles, blocks_per_q_tile, /*causal=*/false, false, chains});
                    if (kv_tiles <= q_tiles)  // the launcher rotates only then
                        check_order(DqOrder{kv_tiles, q_tiles, blocks_per_q_tile, /*causal=*/false, true, chains});
                }
}

TEST_CASE("11: the launcher rotates the walks only where a head's blocks fit on the GPU at once") {
    CHECK(rotate_dq_chains(64, 64, false, 132));
    CHECK(rotate_dq_chains(132, 200, false, 132));
    CHECK_FALSE(rotate_dq_chains(133, 200, false, 132));  // a block could wait for one that never starts
    CHECK_FALSE(rotate_dq_chains(8, 5, false, 132));      // fewer query tiles than key blocks
    CHECK_FALSE(rotate_dq_chains(64, 64, true, 132));     // causal has its own order
    CHECK_FALSE(rotate_dq_chains(1, 64, false, 132));     // one block: nothing to order
    // Two chains where one would put a block's predecessor less than two steps ahead of it.
    CHECK(dq_chain_count(64, 64, false, 2) == 2);   // 1x8x4096x8192, D = 128
    CHECK(dq_chain_count(32, 64, false, 2) == 1);   // 1x32x4096^2, D = 128
    CHECK(dq_chain_count(32, 32, false, 1) == 2);   // 4x8x4096^2, D = 64
    CHECK(dq_chain_count(32, 64, true, 2) == 1);    // causal, D = 128
    CHECK(dq_chain_count(32, 32, true, 1) == 2);    // causal, D = 64
    CHECK(dq_chain_count(8, 5, false, 1) == 2);     // fewer query tiles than key blocks
    CHECK(dq_chain_count(1, 5, false, 1) == 1);     // one key block
}
