// Host cases of stage 05: the XOR swizzle of common/swizzle.h is a bijection on the tile, and
// it removes the shared-memory bank conflicts of ldmatrix. Run everywhere, CI included.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <vector>

#include "swizzle.h"
#include "test_support.h"

namespace {

constexpr int kBanks = 32;
constexpr int kBankBytes = 4;
constexpr int kTileRows = 128;  // the largest tile a stage stages in shared memory

template <int ROW_ELEMENTS, bool SWIZZLED>
bool is_bijection() {
    using Layout = TileLayout<ROW_ELEMENTS, SWIZZLED>;
    std::vector<int> hits(size_t(kTileRows) * ROW_ELEMENTS, 0);
    for (int row = 0; row < kTileRows; ++row)
        for (int column = 0; column < ROW_ELEMENTS; ++column) {
            const int offset = Layout::offset(row, column);
            if (offset < 0 || offset >= int(hits.size())) return false;
            ++hits[size_t(offset)];
        }
    return std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; });
}

// One 8x8 ldmatrix access reads 8 rows (first_row .. first_row + 7) of 16 bytes at chunk
// `chunk`: 32 words in one shared-memory wavefront if they fall in 32 distinct banks. Returns
// the worst number of words that share a bank (1: conflict-free, n: an n-way conflict).
template <int ROW_ELEMENTS, bool SWIZZLED>
int ldmatrix_conflict_degree(int first_row, int chunk) {
    using Layout = TileLayout<ROW_ELEMENTS, SWIZZLED>;
    std::array<int, kBanks> words_per_bank{};
    for (int r = 0; r < 8; ++r) {
        const int row = first_row + r;
        const int byte = Layout::offset(row, chunk * Layout::CHUNK_ELEMENTS) * 2;
        for (int word = 0; word < 16 / kBankBytes; ++word)
            ++words_per_bank[size_t((byte / kBankBytes + word) % kBanks)];
    }
    return *std::max_element(words_per_bank.begin(), words_per_bank.end());
}

// The worst conflict over every 8x8 access of the tile that mma's fragments use: 8 rows
// starting at a multiple of 8, any 16-byte column.
template <int ROW_ELEMENTS, bool SWIZZLED>
int worst_conflict_degree() {
    int worst = 0;
    for (int first_row = 0; first_row < kTileRows; first_row += 8)
        for (int chunk = 0; chunk < ROW_ELEMENTS / 8; ++chunk)
            worst = std::max(worst, ldmatrix_conflict_degree<ROW_ELEMENTS, SWIZZLED>(first_row, chunk));
    return worst;
}

}  // namespace

TEST_CASE("swizzle: a bijection on tiles with 64- and 128-element rows") {
    CHECK(is_bijection<64, true>());
    CHECK(is_bijection<128, true>());
    CHECK(is_bijection<64, false>());
    CHECK(is_bijection<128, false>());
}

TEST_CASE("swizzle: chunks stay inside their row and elements inside their chunk") {
    using Layout = TileLayout<128>;
    for (int row = 0; row < kTileRows; ++row)
        for (int column = 0; column < 128; ++column) {
            const int offset = Layout::offset(row, column);
            CHECK(offset / 128 == row);
            CHECK(offset % 8 == column % 8);
        }
}

TEST_CASE("swizzle: every 8x8 ldmatrix access of the swizzled tile touches 32 distinct banks") {
    CHECK(worst_conflict_degree<64, true>() == 1);
    CHECK(worst_conflict_degree<128, true>() == 1);
}

TEST_CASE("swizzle: the unswizzled tile has 8-way conflicts on every 8x8 ldmatrix access") {
    // Rows are 128 or 256 bytes apart, a multiple of the 128 bytes the 32 banks span, so all
    // 8 rows of an access start in the same bank.
    for (int chunk = 0; chunk < 8; ++chunk) {
        CHECK(ldmatrix_conflict_degree<64, false>(0, chunk) == 8);
        CHECK(ldmatrix_conflict_degree<128, false>(8, chunk) == 8);
    }
    CHECK(worst_conflict_degree<64, false>() == 8);
    CHECK(worst_conflict_degree<128, false>() == 8);
}
