// Shared pieces of the test suites.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "attention.h"
#include "element.h"
#include "harness.h"

// A case that needs a GPU the stage can run on: reported as skipped, by name and with the
// reason, where none is visible or the GPU is not the one the stage needs (08-11: Hopper).
inline bool stage_gpu_usable() { return gpu_unusable_reason(stage_capabilities()).empty(); }
#define GPU_TEST_CASE(name) TEST_CASE(name * doctest::skip(!stage_gpu_usable()))

// FP32 stages within 1e-5 of the FP64 reference, BF16 stages within 1e-2 (relative L2).
inline double tolerance() { return sizeof(Element) == 4 ? 1e-5 : 1e-2; }

// The lengths every stage must get right: tile edges on both sides, primes, and one.
inline const std::vector<int>& edge_lengths() {
    static const std::vector<int> lengths{1, 2, 17, 63, 64, 65, 127, 1000};
    return lengths;
}

// (len_q, len_kv) pairs with len_q != len_kv, both ways round, across tile edges.
inline const std::vector<std::pair<int, int>>& unequal_lengths() {
    static const std::vector<std::pair<int, int>> lengths{{1, 65},   {65, 1},   {17, 1000},
                                                          {1000, 17}, {64, 127}, {127, 63},
                                                          {200, 333}, {333, 200}};
    return lengths;
}

// The small edge shapes that `make sanitize` runs under compute-sanitizer.
inline std::vector<AttentionShape> sanitize_shapes(int head_dim, bool causal) {
    return {make_shape(1, 1, 1, 1, head_dim, causal), make_shape(1, 2, 65, 17, head_dim, causal),
            make_shape(2, 1, 17, 130, head_dim, causal)};
}

// Host inputs of a stage's element type, rounded the same way the device sees them.
inline std::vector<float> stage_inputs(size_t count, uint64_t seed) {
    std::vector<float> values = random_inputs(count, seed);
    return sizeof(Element) == 4 ? values : rounded_to_bf16(values);
}

// Elements past the end of every output buffer that must stay poisoned: catches writes past
// the end.
inline constexpr size_t kGuard = 256;

// True when every byte still holds the 0xFF poison (a NaN in float and in bf16).
inline bool still_poisoned(const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    return std::all_of(p, p + bytes, [](unsigned char b) { return b == 0xFF; });
}

// Runs body(head_dim, causal) for every head dim the stage supports, causal and not.
template <class Body>
void for_each_variant(Body body) {
    const StageCapabilities& caps = stage_capabilities();
    for (int head_dim : caps.head_dims)
        for (bool causal : {false, true})
            if (causal ? caps.causal : true) body(head_dim, causal);
}
