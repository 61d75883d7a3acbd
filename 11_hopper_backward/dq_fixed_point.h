// Deterministic mode: dQ and the dS row sums summed as 32-bit integers. Integer addition is
// associative, so the blocks' pieces may reach a sum in any order and still give the same bits;
// what it takes is a scale per query row that turns every piece into an integer without
// overflow, the same for every block that adds into the row.
//
// The bound. With sum_j P_ij <= 1 (the softmax), |dP_ij| = |dO_i . V_j| <= |dO_i| Vmax and
// |delta_i| = |dO_i . O_i| <= |dO_i| |O_i|, so the part of rowsum(dS) that any set of keys gives is
// at most  rowsum_bound_i = |dO_i| (Vmax + |O_i|),  and the same part of dQ's uncentred sum
// sum_j dS_ij K_j at most  rowsum_bound_i Kmax  in every column (Vmax: the largest key row norm of
// V in the head; Kmax: the largest |K| element; |.|: Euclidean norms). The scale is the power of
// two that maps the bound just below 2^FIXED_POINT_BITS; int32 then holds every partial sum with
// a factor of four to spare (the rounding of P, dS and the norms stays far inside it), and a
// piece is rounded to a step of at most bound / 2^(FIXED_POINT_BITS - 1). A power of two, so that
// scaling and unscaling are exact and the conversion kernel undoes the main kernel's bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FIXED_POINT_FN __host__ __device__ __forceinline__
#else
#define FIXED_POINT_FN inline
#endif

constexpr int FIXED_POINT_BITS = 29;
// The key rows of a head are searched for Vmax and Kmax in this many chunks, one block each
// (backward_kv_bounds_kernel); a head's bound is the largest of its chunks'.
constexpr int KV_BOUND_CHUNKS = 32;

// excerpt: fixed-point-scale
// The power of two s with bound s < 2^FIXED_POINT_BITS <= 2 bound s. A bound of 0 (a row whose
// dO is 0, so is its dS) or below 2^-90 takes the scale of 2^-90; an infinite or NaN bound (norms
// beyond FP32) the scale of the largest float, so that nothing overflows int32 but such rows lose
// their precision.
FIXED_POINT_FN float fixed_point_scale(float bound) {
    constexpr float SMALLEST = 0x1p-90f, LARGEST = 3.4028234663852886e38f;
    if (!(bound >= SMALLEST)) bound = SMALLEST;  // also NaN
    if (!(bound <= LARGEST)) bound = LARGEST;
    uint32_t bits;
    memcpy(&bits, &bound, sizeof bits);
    const int exponent = int(bits >> 23) - 127;  // 2^exponent <= bound < 2^(exponent + 1)
    const uint32_t scale_bits = uint32_t(FIXED_POINT_BITS - (exponent + 1) + 127) << 23;
    float scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    return scale;
}
// end excerpt
