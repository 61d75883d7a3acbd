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
// reason, where none is visible or the GPU is not the one the stage needs (08-12: Hopper).
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

// The shapes that `make sanitize` runs under compute-sanitizer (docs/sanitizers.md), one group
// per `sanitize:` case, so that a stage's Makefile can give each tool the groups it can check.
// Under racecheck a kernel runs about a hundred times slower than natively, so every shape is
// the smallest that reaches its code path in every stage. Tiles are at most 192 queries x 176
// keys (08-12), 128 x 128 (07), 64 x 32..64 (the FP32 stages).
//
// Edges: one query tile and one or two key tiles; length 1, and lengths just past a tile.
inline std::vector<AttentionShape> sanitize_shapes(int head_dim, bool causal) {
    return {make_shape(1, 1, 1, 1, head_dim, causal), make_shape(1, 2, 65, 17, head_dim, causal),
            make_shape(2, 1, 17, 130, head_dim, causal)};
}

// Tiles: more than one query tile and more than one key tile in every stage, len_q < len_kv and
// len_q > len_kv, batch > 1 and heads > 1. Causal, whole key tiles past the diagonal are
// skipped, and at len_q < len_kv the last key tiles see no query at all (a backward block that
// owns them must still write zeros to its dK and dV).
inline std::vector<AttentionShape> sanitize_tile_shapes(int head_dim, bool causal) {
    return {make_shape(2, 1, 200, 333, head_dim, causal), make_shape(1, 2, 333, 200, head_dim, causal)};
}

// Exact D (backward): len_kv <= 128, so one block holds every key (kv_tiles == 1 in 07 and 11)
// and computes D = rowsum(P * dP) itself, over several query tiles (64 or 128 queries each):
// a short key tile, and a full one.
inline std::vector<AttentionShape> sanitize_exact_d_shapes(int head_dim, bool causal) {
    return {make_shape(1, 2, 600, 17, head_dim, causal), make_shape(1, 1, 300, 128, head_dim, causal)};
}

// Host inputs of a stage's element type, rounded the same way the device sees them: randn +
// mean (0.5 unless asked otherwise).
inline std::vector<float> stage_inputs(size_t count, uint64_t seed, float mean = 0.5f) {
    std::vector<float> values = random_inputs(count, seed, mean);
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

// One forward call on fresh random inputs against the FP64 reference (common/test_forward.cpp):
// O within the element type's tolerance (BF16: also within twice a plain BF16 implementation's
// error), the LSE within 1e-5 or left untouched when null, nothing written past either end.
// For a stage's own cases too (12_persistent's shapes that reach its persistent grid).
void check_forward(const AttentionShape& shape, bool with_lse = true);

#if defined(ATTENTION_HAS_BACKWARD)
// One backward pass on fresh random inputs against the FP64 reference (common/test_backward.cpp):
// dQ, dK and dV within the tolerance, nothing written past their ends. For a stage's own cases
// too (11_hopper_backward's shapes whose conversion of dQ runs beside the main kernel).
void check_backward(const AttentionShape& shape);
// deterministic = true: `runs` backward passes on fresh random inputs (common/test_backward.cpp),
// the first within the tolerance of the FP64 reference, every later one the same bit for bit.
// For a stage's own cases too (11_hopper_backward's order of the dQ chains).
void check_deterministic(AttentionShape shape, int runs);
#endif
