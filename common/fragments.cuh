// mma.sync operands (m16n8k16, bf16) loaded with ldmatrix from a tile in shared memory whose
// element offsets come from Layout::offset(row, column) (a TileLayout of swizzle.h): the
// fragments stage 07's backward feeds its five products with. Lane l supplies the address of
// one 16-byte row piece; see ptx.cuh for ldmatrix.
#pragma once

#include <cuda_bf16.h>

#include "ptx.cuh"

// A (16 x 16) from a row-major tile: rows row_start.., columns column_start..
template <class Layout>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const __nv_bfloat16* tile, int row_start,
                                       int column_start, int lane) {
    ldmatrix_x4(a, smem_address(tile + Layout::offset(row_start + lane % 16,
                                                      column_start + (lane / 16) * 8)));
}
// A (16 x 16) whose transpose is stored: the tile holds A^T row-major (rows are A's k).
template <class Layout>
__device__ __forceinline__ void load_a_transposed(uint32_t (&a)[4], const __nv_bfloat16* tile,
                                                  int m_start, int k_start, int lane) {
    ldmatrix_x4_trans(a, smem_address(tile + Layout::offset(k_start + lane % 8 + (lane / 16) * 8,
                                                            m_start + ((lane / 8) % 2) * 8)));
}
// B of two n-tiles (b[0..1]: n_start.., b[2..3]: n_start + 8..) over k_start..+15, from a tile
// that stores B^T row-major ([n][k], as K is stored for S = Q K^T).
template <class Layout>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], const __nv_bfloat16* tile, int n_start,
                                       int k_start, int lane) {
    ldmatrix_x4(b, smem_address(tile + Layout::offset(n_start + lane % 8 + (lane / 16) * 8,
                                                      k_start + ((lane / 8) % 2) * 8)));
}
// The same two n-tiles from a tile that stores B row-major ([k][n], as V is for O = P V).
template <class Layout>
__device__ __forceinline__ void load_b_transposed(uint32_t (&b)[4], const __nv_bfloat16* tile,
                                                  int n_start, int k_start, int lane) {
    ldmatrix_x4_trans(b, smem_address(tile + Layout::offset(k_start + lane % 8 + ((lane / 8) % 2) * 8,
                                                            n_start + (lane / 16) * 8)));
}
__device__ __forceinline__ void store_bf16x2(__nv_bfloat16* destination, float low, float high) {
    *reinterpret_cast<__nv_bfloat162*>(destination) = __floats2bfloat162_rn(low, high);
}
// acc[n] and acc[n + 1] (two 8-column tiles of one 16-row tile) += a times the two n-tiles in b
// (as load_b and load_b_transposed deliver them).
template <int N>
__device__ __forceinline__ void mma_two_tiles(float (&acc)[N][4], int n, const uint32_t (&a)[4],
                                              const uint32_t (&b)[4]) {
    mma_m16n8k16_bf16(acc[n], a, b[0], b[1]);
    mma_m16n8k16_bf16(acc[n + 1], a, b[2], b[3]);
}
