// Division by a divisor fixed for a launch, as a multiply-high, an add and a shift: stage 12's
// loader and merge kernel (attention.cu) and the host tests (test_12.cu) include it.
#pragma once

#include <cstdint>

// excerpt: divisor
// A division by a number known only at run time is a software routine of about twenty
// dependent instructions (a reciprocal on the MUFU unit, conversions, corrections), and the
// grid order (work_tile) takes two of them per work tile, a split part two more. The loader is
// one thread: at one work tile per block (short sequences) those divisions came before its
// first loads (lab notes 12). So the host works out, once per launch, a magic number for each
// divisor (Granlund and Montgomery: with l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1,
// n / d = (umulhi(n, m) + n) >> l for 0 <= n < 2^31), and the kernel divides with a
// multiply-high, an add and a shift.
struct Divisor {
    int value;
    uint32_t multiplier;
    int shift;
    __host__ __device__ int divide(int n) const {
#ifdef __CUDA_ARCH__
        return int((__umulhi(uint32_t(n), multiplier) + uint32_t(n)) >> shift);
#else
        return int((uint32_t((uint64_t(uint32_t(n)) * multiplier) >> 32) + uint32_t(n)) >> shift);
#endif
    }
};
inline Divisor make_divisor(int value) {
    int shift = 0;
    while ((int64_t(1) << shift) < value) ++shift;
    const uint64_t multiplier = (uint64_t(1) << 32) * ((uint64_t(1) << shift) - uint64_t(value)) / uint64_t(value) + 1;
    return Divisor{value, uint32_t(multiplier), shift};
}
// end excerpt
