// The XOR swizzle of a row-major bf16 tile in shared memory (chapter 05).
// A row of ROW_ELEMENTS (64 or 128) bf16 is 8 or 16 chunks of 16 bytes. Without a swizzle,
// rows 128 or 256 bytes apart start in the same bank, so the 8 rows that one ldmatrix 8x8
// access reads (16 bytes each, same column) all fall in the same 4 banks: an 8-way conflict.
// XOR-ing the chunk index with row % 8 moves those 8 pieces to 8 different chunk positions,
// i.e. to 8 different groups of 4 banks. Pure index arithmetic, usable on host and device.
#pragma once

// excerpt: swizzle
template <int ROW_ELEMENTS, bool SWIZZLED = true>
struct TileLayout {
    static_assert(ROW_ELEMENTS == 64 || ROW_ELEMENTS == 128, "rows of 64 or 128 bf16");
    static constexpr int CHUNK_ELEMENTS = 8;  // 16 bytes of bf16
    static constexpr int CHUNKS_PER_ROW = ROW_ELEMENTS / CHUNK_ELEMENTS;

    // Where chunk `chunk` of row `row` is stored, in chunks from the start of the row.
    __host__ __device__ static constexpr int chunk_slot(int row, int chunk) {
        return SWIZZLED ? (chunk ^ (row % 8)) : chunk;
    }
    // Element offset of (row, column) from the start of the tile.
    __host__ __device__ static constexpr int offset(int row, int column) {
        return row * ROW_ELEMENTS + chunk_slot(row, column / CHUNK_ELEMENTS) * CHUNK_ELEMENTS +
               column % CHUNK_ELEMENTS;
    }
};
// end excerpt
