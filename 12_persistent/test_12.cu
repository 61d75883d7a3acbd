// The cases only stage 12's persistent grid has: shapes with more work tiles than the GPU has
// SMs (causal: four times as many, where the launcher uses its tile counter), so that every
// block walks several of them (the shared suite's shapes fit in one wave: none of them reaches
// the code that passes from one work tile to the next). One K/V tile per work tile (a new work
// tile at every step), several of ragged lengths, causal and not, LSE null once; and a small
// one for `make sanitize`. The checks are the shared suite's: the FP64 reference, NaN-poisoned
// outputs, nothing written past their ends.
#include "test_support.h"

#include <climits>
#include <cstdint>

#include "divisor.h"
#include "split_plan.h"

namespace {

int multiprocessors() {
    int device = 0, count = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
}

// The SMs the launcher plans for: the device's, or an H100 SXM's 132 where none is visible (CI),
// as attention_workspace_bytes does.
int multiprocessors_or_h100() {
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 132;
    }
    return count;
}

// Work tiles of the shape: BLOCK_Q is 128 at D = 128 (two consumers), 192 at D = 64 (three).
int64_t work_tiles(const AttentionShape& shape) {
    const int block_q = shape.head_dim == 64 ? 192 : 128;
    return int64_t(shape.batch) * shape.heads * ((shape.len_q + block_q - 1) / block_q);
}

// The split of the shape's last round (split_plan.h), with the kernel's tiles (BLOCK_KV 128):
// D = 64 and non-causal only; anything else keeps its work tiles whole.
SplitPlan split_of(const AttentionShape& shape, int sms) {
    if (shape.head_dim != 64 || shape.causal) return SplitPlan{int(work_tiles(shape)), 0, 1};
    return plan_split(int(work_tiles(shape)), sms, (shape.len_kv + 127) / 128);
}

// The shared suite's check on a non-causal shape that must take the split path.
void check_split(const AttentionShape& shape, bool with_lse = true) {
    const SplitPlan plan = split_of(shape, multiprocessors());
    INFO("work tiles=", work_tiles(shape), " SMs=", multiprocessors(), " whole=", plan.whole,
         " split tiles=", plan.split_tiles, " parts=", plan.parts);
    REQUIRE_MESSAGE(plan.split(), "the shape does not take the split path");
    check_forward(shape, with_lse);
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

GPU_TEST_CASE("12: persistent grid: a long non-causal call takes its tiles from the counter") {
    // Sixteen work tiles per SM and more (one query tile per head): the counter, not the stride.
    // At D = 64 with 4,096 keys the last round is split as well, so that the counter hands out
    // the parts after the whole tiles.
    const int sms = multiprocessors();
    for (const int head_dim : {64, 128}) {
        const AttentionShape shape = make_shape(1, 16 * sms + 3, 7, 300, head_dim, false);
        REQUIRE(attention_workspace_bytes(shape) == sizeof(int));
        check_persistent(shape);
    }
    const AttentionShape split = make_shape(1, 16 * sms + 44, 1, 4096, 64, false);
    REQUIRE(split_of(split, sms).split());
    CHECK(attention_workspace_bytes(split) > sizeof(int));
    check_forward(split);
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

TEST_CASE("12: workspace: the tile counter, or the split work tiles' parts") {
    // The launcher zeroes one int for the counter before a causal launch (and uses it from four
    // work tiles per SM on) and before a non-causal one of sixteen work tiles per SM or more; a
    // non-causal call needs the parts' FP32 O and LSE where it splits its last round (the SMs'
    // count decides: 132 where no device is visible), else nothing.
    const int sms = multiprocessors_or_h100();
    for (const int head_dim : {64, 128}) {
        const int block_q = head_dim == 64 ? 192 : 128;
        CHECK(attention_workspace_bytes(make_shape(1, 1, 1, 1, head_dim, true)) == sizeof(int));
        CHECK(attention_workspace_bytes(make_shape(16, 16, 4096, 4096, head_dim, true)) == sizeof(int));
        CHECK(attention_workspace_bytes(make_shape(1, 1, 1, 1, head_dim, false)) == 0);  // one K/V tile
        // 16 tiles per SM less one: no counter; exactly 16: the counter (one query tile per head).
        CHECK(attention_workspace_bytes(make_shape(1, 16 * sms - 1, block_q, 200, head_dim, false)) == 0);
        CHECK(attention_workspace_bytes(make_shape(1, 16 * sms, block_q, 200, head_dim, false)) == sizeof(int));
        // 5,632 (D = 64) or 8,192 work tiles: the counter, and the parts of a split where there is one.
        const size_t bytes = attention_workspace_bytes(make_shape(16, 16, 4096, 4096, head_dim, false));
        const size_t part_bytes = size_t(block_q) * (head_dim + 1) * sizeof(float);
        REQUIRE(bytes >= sizeof(int));
        CHECK((bytes - sizeof(int)) % part_bytes == 0);
    }
}

TEST_CASE("12: the split of the last round") {
    // excerpt: split-example
    // 4x8x4096^2 at D = 64: 704 work tiles of 32 K/V tiles on 132 SMs; 5 full rounds, then 44
    // tiles cut in 3: 132 parts of 10-11 K/V tiles, one round of them.
    const SplitPlan headline = plan_split(704, 132, 32);
    CHECK(headline.whole == 660);
    CHECK(headline.split_tiles == 44);
    CHECK(headline.parts == 3);
    CHECK(headline.items() == 660 + 132);
    // end excerpt
    // Fewer tiles than SMs: all of them split, in halves (128 parts on 132 SMs).
    const SplitPlan few = plan_split(64, 132, 32);
    CHECK(few.whole == 0);
    CHECK(few.split_tiles == 64);
    CHECK(few.parts == 2);
    // (The arithmetic alone: the kernel splits at D = 64 only.) 1,024 tiles of 24: the last
    // round is 100 of 132, and no split beats a whole tile by the margin once its costs count.
    CHECK(plan_split(1024, 132, 24).parts == 1);
    CHECK(plan_split(1024, 132, 24).items() == 1024);
    // 4,096 tiles of 94: 4 tiles left, cut fine.
    const SplitPlan long_tail = plan_split(4096, 132, 94);
    CHECK(long_tail.split_tiles == 4);
    CHECK(long_tail.parts > 16);
    CHECK(last_round_kv_tiles(4, long_tail.parts, 132, 94) + SPLIT_COST_KV_TILES < 94 / 4);
    // Nothing to balance: a multiple of the SMs, one or two K/V tiles (no part of two or more),
    // a single tile of few K/V tiles.
    CHECK(plan_split(264, 132, 32).parts == 1);
    CHECK(plan_split(64, 132, 2).parts == 1);
    CHECK(plan_split(64, 132, 3).parts == 1);
    CHECK(plan_split(1, 132, 1).parts == 1);
    // A long call whose last round is a sliver of its time: the shared suite's "workspace larger
    // than the device" shape, 64x64x65536^2 at D = 64 (1,400,832 work tiles of 512 K/V tiles,
    // 10,613 rounds): no split, so no parts; the tile counter alone, which that case lets fit.
    CHECK(plan_split(1400832, 132, 512).parts == 1);
    CHECK(attention_workspace_bytes(make_shape(64, 64, 1 << 16, 1 << 16, 64, false)) == sizeof(int));
    // Every plan: the parts cover the tiles left after whole rounds, each part two K/V tiles
    // at least, and a split shortens the last round by the margin.
    for (int tiles = 1; tiles <= 600; tiles += 7)
        for (int n : {1, 2, 4, 7, 8, 24, 32, 94}) {
            const SplitPlan plan = plan_split(tiles, 132, n);
            CHECK(plan.whole + plan.split_tiles == tiles);
            if (!plan.split()) continue;
            CHECK(plan.whole % 132 == 0);
            CHECK(plan.split_tiles == (tiles >= 132 ? tiles % 132 : tiles));
            CHECK(n / plan.parts >= 2);
            // The parts' K/V ranges (part_begin, through the kernel's part_begin_of) tile 0 .. n - 1 in order.
            CHECK(part_begin(0, plan.parts, n) == 0);
            CHECK(part_begin(plan.parts, plan.parts, n) == n);
            for (int p = 0; p < plan.parts; ++p)
                CHECK(part_begin(p + 1, plan.parts, n) - part_begin(p, plan.parts, n) >= 2);
            const int after = last_round_kv_tiles(plan.split_tiles, plan.parts, 132, n) + SPLIT_COST_KV_TILES;
            CHECK(after * 100 <= (100 - SPLIT_MARGIN_PERCENT) * n);
            CHECK((n - after) * 1000 >= SPLIT_MIN_GAIN_PERMILLE * ((tiles + 131) / 132) * n);
        }
}

TEST_CASE("12: Divisor: n / d as a multiply-high, an add and a shift, for 0 <= n < 2^31") {
    // Every divisor up to 2,000 and those next to each power of two up to 2^30, and INT_MAX; the
    // dividends around multiples of the divisor (where a quotient steps), the ends of the range,
    // and pseudo-random ones. The kernel's divide() is the same expression with __umulhi.
    std::vector<int> divisors;
    for (int d = 1; d <= 2000; ++d) divisors.push_back(d);
    for (int k = 11; k <= 30; ++k)
        for (int64_t d : {(int64_t(1) << k) - 1, int64_t(1) << k, (int64_t(1) << k) + 1}) divisors.push_back(int(d));
    divisors.push_back(INT_MAX);
    uint64_t state = 0x9e3779b97f4a7c15ull;
    int64_t checked = 0, wrong = 0;
    for (const int d : divisors) {
        const Divisor divisor = make_divisor(d);
        std::vector<int64_t> dividends = {0, 1, d - 1, d, int64_t(d) + 1, INT_MAX, INT_MAX - 1, INT_MAX / d * int64_t(d),
                                          INT_MAX / d * int64_t(d) - 1};
        for (int64_t q : {2, 3, 7, 1000, 65537})
            for (int64_t delta : {-1, 0, 1}) dividends.push_back(q * d + delta);
        for (int i = 0; i < 64; ++i) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            dividends.push_back(int64_t(state >> 33));  // 31 bits
        }
        for (const int64_t n : dividends) {
            if (n < 0 || n > INT_MAX) continue;
            ++checked;
            if (divisor.divide(int(n)) != int(n / d)) {
                if (wrong++ == 0) FAIL_CHECK("divide(" << n << ") by " << d << " = " << divisor.divide(int(n)));
            }
        }
    }
    INFO(checked, " divisions checked");
    CHECK(wrong == 0);
    CHECK(checked > 100000);
}

GPU_TEST_CASE("12: split last round: parts along K/V merged by log-sum-exp") {
    const int sms = multiprocessors();
    // D = 64. Whole rounds, then 4 work tiles left (one query tile a head) over 1,000 keys (8
    // K/V tiles): cut in parts, the last one ending in a partial K/V tile; 150 query rows, so
    // that some rows of every part are outside the tensor.
    check_split(make_shape(1, sms + 4, 150, 1000, 64, false));
    // Fewer work tiles than SMs: all split (2 x 2 query tiles of 300 rows).
    check_split(make_shape(1, 2, 300, 1000, 64, false));
    check_split(make_shape(1, 2, 300, 1000, 64, false), /*with_lse=*/false);
    // len_q != len_kv the other way, a tail of one key in the last K/V tile.
    check_split(make_shape(2, 3, 77, 1409, 64, false));
    // D = 128 keeps its work tiles whole on the same shapes: no workspace, the same results.
    for (const AttentionShape& shape : {make_shape(1, sms + 4, 150, 1000, 128, false), make_shape(2, 3, 77, 1409, 128, false)}) {
        CHECK(attention_workspace_bytes(shape) == 0);
        check_forward(shape);
    }
}

GPU_TEST_CASE("12: workspace: what the forward allocates for the split") {
    const int sms = multiprocessors();
    const AttentionShape shape = make_shape(1, sms + 4, 150, 1000, 64, false);
    const SplitPlan plan = split_of(shape, sms);
    REQUIRE(plan.split());
    CHECK(attention_workspace_bytes(shape) == size_t(plan.split_tiles) * plan.parts * 192 * (64 + 1) * sizeof(float));
}

// Run by `make sanitize` too: every block passes from one work tile to the next at least once,
// at a stride and, non-causal, from the counter of a long call.
GPU_TEST_CASE("sanitize: persistent work tiles") {
    const int sms = multiprocessors();
    for_each_variant([&](int head_dim, bool causal) {
        check_persistent(make_shape(1, 2 * sms, 200, 130, head_dim, causal));
    });
    for (const int head_dim : {64, 128}) check_persistent(make_shape(1, 16 * sms + 1, 1, 130, head_dim, false));
}

// Run by `make sanitize` too: a split last round (parts, their workspace, the merge kernel),
// one block passing from a whole tile to parts (sms + 1 work tiles).
GPU_TEST_CASE("sanitize: split last round") {
    const int sms = multiprocessors();
    check_split(make_shape(1, 2, 300, 1000, 64, false));
    check_split(make_shape(1, sms + 1, 64, 1000, 64, false), /*with_lse=*/false);
}
