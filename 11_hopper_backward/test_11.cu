// The cases only stage 11 has: the deterministic backward's scale that turns a query row's
// pieces of dQ into integers (dq_fixed_point.h), checked on the host, and the shapes long enough
// for the conversion of dQ to run beside the main kernel. The GPU cases of the deterministic
// mode are the shared suite's (common/test_backward.cpp): the same bits run to run, and the FP64
// reference's tolerance, over the shape matrix.
#include <cmath>
#include <cstdint>
#include <limits>

#include "dq_fixed_point.h"
#include "test_support.h"

namespace {

// A power of two with bound s < 2^FIXED_POINT_BITS <= 2 bound s, finite and normal, so that
// every partial sum of a row (at most its bound) fits int32 with a factor of four to spare, and
// the rounding step 1 / s is at most bound / 2^(FIXED_POINT_BITS - 1).
void check_scale(float bound) {
    INFO("bound = ", bound);
    const float scale = fixed_point_scale(bound);
    REQUIRE(std::isnormal(scale));
    int exponent = 0;
    CHECK(std::frexp(double(scale), &exponent) == 0.5);  // a power of two
    const double limit = std::ldexp(1.0, FIXED_POINT_BITS);
    CHECK(double(bound) * scale < limit);
    CHECK(2.0 * double(bound) * scale >= limit);
    CHECK(double(bound) * scale * 4.0 < double(std::numeric_limits<int32_t>::max()));
}

}  // namespace

TEST_CASE("11: the fixed-point scale is the power of two that maps a row's bound just below 2^29") {
    for (float bound : {0x1p-90f, 1.0e-20f, 3.0e-5f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 1000.0f, 123456.0f, 6.5e20f,
                        1.0e38f, std::numeric_limits<float>::max()})
        check_scale(bound);
    // Every exponent and a few mantissas in between.
    for (int exponent = -90; exponent <= 127; ++exponent)
        for (float mantissa : {1.0f, 1.25f, 1.999f}) check_scale(std::ldexp(mantissa, exponent));
    CHECK(fixed_point_scale(1.0f) == std::ldexp(1.0f, FIXED_POINT_BITS - 1));
    CHECK(fixed_point_scale(0.75f) == std::ldexp(1.0f, FIXED_POINT_BITS));
}

TEST_CASE("11: rows with no bound to speak of get a finite scale that keeps int32 from overflowing") {
    // dO_i = 0 (so is the row's dS), a bound below 2^-90, and norms beyond FP32.
    CHECK(fixed_point_scale(0.0f) == fixed_point_scale(0x1p-90f));
    CHECK(fixed_point_scale(1.0e-40f) == fixed_point_scale(0x1p-90f));  // subnormal
    CHECK(fixed_point_scale(-1.0f) == fixed_point_scale(0x1p-90f));
    CHECK(fixed_point_scale(std::numeric_limits<float>::quiet_NaN()) == fixed_point_scale(0x1p-90f));
    CHECK(fixed_point_scale(std::numeric_limits<float>::infinity()) ==
          fixed_point_scale(std::numeric_limits<float>::max()));
    CHECK(std::isnormal(fixed_point_scale(0.0f)));
}

// The conversion of dQ beside the main kernel (PROGRESSIVE_MIN_ROUNDS in attention.cu): grids of
// more than two rounds of an H100's 132 SMs, which the shared suite's shapes do not reach.
// Causal with len_q < len_kv leaves blocks that see no query tile (their writers count at once),
// and 333 rows end inside a tile.
GPU_TEST_CASE("11: the conversion of dQ beside the main kernel's last rounds") {
    for (int head_dim : {64, 128})
        for (bool causal : {false, true}) {
            check_backward(make_shape(1, 40, 200, 1100, head_dim, causal));  // 40 x 9 blocks
            check_backward(make_shape(3, 11, 333, 1025, head_dim, causal));  // 33 x 9 blocks
        }
}

// The same path under compute-sanitizer: 34 heads of 8 key blocks, a query tile each (causal:
// most blocks see none).
GPU_TEST_CASE("sanitize: 11 long grids") {
    check_backward(make_shape(2, 17, 70, 1000, 64, true));
    check_backward(make_shape(2, 17, 70, 1000, 128, false));
}
