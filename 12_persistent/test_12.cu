// The cases only stage 12's persistent grid has: shapes with more work tiles than the GPU has
// SMs (causal: four times as many, where the launcher uses its tile counter), so that every
// block walks several of them (the shared suite's shapes fit in one wave: none of them reaches
// the code that passes from one work tile to the next). One K/V tile per work tile (a new work
// tile at every step), several of ragged lengths, causal and not, LSE null once; and a small
// one for `make sanitize`. The checks are the shared suite's: the FP64 reference, NaN-poisoned
// outputs, nothing written past their ends.
#include "test_support.h"

namespace {

int multiprocessors() {
    int device = 0, count = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
}

// Work tiles of the shape: BLOCK_Q is 128 at D = 128 (two consumers), 192 at D = 64 (three).
int64_t work_tiles(const AttentionShape& shape) {
    const int block_q = shape.head_dim == 64 ? 192 : 128;
    return int64_t(shape.batch) * shape.heads * ((shape.len_q + block_q - 1) / block_q);
}

// The shared suite's check (common/test_support.h), on a shape that first must reach the
// persistent grid: more work tiles than SMs (causal: four per SM, the tile counter).
void check_persistent(const AttentionShape& shape, bool with_lse = true) {
    INFO("work tiles=", work_tiles(shape), " SMs=", multiprocessors());
    const int64_t needed = shape.causal ? 4 * int64_t(multiprocessors()) : int64_t(multiprocessors()) + 1;
    REQUIRE_MESSAGE(work_tiles(shape) >= needed, "the shape does not reach the persistent grid (causal: its tile counter)");
    check_forward(shape, with_lse);
}

}  // namespace

GPU_TEST_CASE("12: persistent grid: one K/V tile per work tile, two and more work tiles per block") {
    const int sms = multiprocessors();
    for_each_variant([&](int head_dim, bool causal) {
        // A new work tile at every K/V tile: the first S of one goes out with the last P V of
        // the one before, every time; len_q 64 leaves the second consumer's rows (D = 128) and
        // two of three (D = 64) outside the tensor.
        check_persistent(make_shape(1, 4 * sms + 5, 64, 33, head_dim, causal));
        check_persistent(make_shape(4, sms + 1, 17, 100, head_dim, causal));
    });
}

GPU_TEST_CASE("12: persistent grid: ragged work tiles over several K/V tiles") {
    const int sms = multiprocessors();
    for_each_variant([&](int head_dim, bool causal) {
        // Query tiles of 300 and 400 rows over 261 and 160 keys: partial tiles at both ends,
        // causal work tiles of different lengths taken from the counter.
        check_persistent(make_shape(1, 2 * sms, 300, 261, head_dim, causal));
        check_persistent(make_shape(1, 2 * sms, 400, 160, head_dim, causal), /*with_lse=*/false);
    });
}

TEST_CASE("12: the causal tile counter is the only workspace") {
    // The launcher zeroes one int for the counter before a causal launch (and uses it from four
    // work tiles per SM on); a non-causal call walks a fixed order and needs nothing.
    for (const int head_dim : {64, 128}) {
        CHECK(attention_workspace_bytes(make_shape(1, 1, 1, 1, head_dim, true)) == sizeof(int));
        CHECK(attention_workspace_bytes(make_shape(16, 16, 4096, 4096, head_dim, true)) == sizeof(int));
        CHECK(attention_workspace_bytes(make_shape(16, 16, 4096, 4096, head_dim, false)) == 0);
    }
}

// Run by `make sanitize` too: every block passes from one work tile to the next at least once.
GPU_TEST_CASE("sanitize: persistent work tiles") {
    const int sms = multiprocessors();
    for_each_variant([&](int head_dim, bool causal) {
        check_persistent(make_shape(1, 2 * sms, 200, 130, head_dim, causal));
    });
}
