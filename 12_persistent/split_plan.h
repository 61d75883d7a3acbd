// Which work tiles the non-causal D = 64 kernel splits along K/V (lab notes 12: "Splitting the last round").
// Non-causal work tiles all take the same time: T of them on S SMs take ceil(T / S) rounds, the
// last one r = T mod S tiles (T when T < S) on S SMs. The first F = T - r stay whole; each of the
// last r is cut into g parts of about n / g of its n K/V tiles, whose partial O and LSE a small
// kernel merges by the log-sum-exp rule. Pure arithmetic, on the host and in the host tests.
#pragma once

#include <cstdint>

struct SplitPlan {
    int whole;        // F: the first work tiles, kept whole (a multiple of S)
    int split_tiles;  // r: the last work tiles, each cut into `parts`
    int parts;        // g: 1 when nothing is split
    constexpr int items() const { return whole + split_tiles * parts; }
    constexpr bool split() const { return parts > 1; }
};

// excerpt: split-cost
// What a split costs beyond its parts, in K/V tiles of work (D = 64, about 1.9 us each): the
// parts' O written in FP32 and read back, the merge kernel's launch and its run. Measured on
// the H100: with 2, a split of 4x8x1024^2 (n = 8) lost 2.3% where the model promised 6.7%.
constexpr int SPLIT_COST_KV_TILES = 4;
// What each part costs beyond its K/V tiles, in K/V tiles: its Q loaded again, its O written
// in FP32 (at D = 64 a work tile's O is 48 KiB), the start of the next part's S = Q K^T.
constexpr int PART_COST_KV_TILES = 1;
// A split must shorten the last round by a tenth of a whole tile at least,
constexpr int SPLIT_MARGIN_PERCENT = 10;
// and the whole call by 1% (in thousandths): a long call whose last round is a sliver of its
// time keeps its tiles whole, and needs no workspace and no second launch.
constexpr int SPLIT_MIN_GAIN_PERMILLE = 10;

// The last round's time, in K/V tiles: r * g parts taken round-robin by S SMs, the longest part
// ceil(n / g) K/V tiles (the parts' sizes differ by one at most), each part its own cost more.
constexpr int last_round_kv_tiles(int r, int g, int sms, int n) {
    return (r * g + sms - 1) / sms * ((n + g - 1) / g + (g > 1 ? PART_COST_KV_TILES : 0));
}
// end excerpt

// The first K/V tile of part p of g of a work tile's n (the kernel's work_item and the host
// tests): the parts cover 0 .. n - 1 in order, the first n mod g of them one K/V tile longer
// than floor(n / g) (in int: p floor(n / g) <= n).
// The kernel's form takes floor(n / g) and n mod g, worked out once on the host (TileOrder).
__host__ __device__ constexpr int part_begin_of(int p, int quotient, int remainder) {
    return p * quotient + (p < remainder ? p : remainder);
}
__host__ __device__ constexpr int part_begin(int p, int g, int n) { return part_begin_of(p, n / g, n % g); }

// excerpt: plan-split
// T work tiles of n K/V tiles each on S SMs: the g from 1 to n / 2 (every part at least two
// K/V tiles) that makes the last round shortest, its cost included; g = 1 unless that beats a
// whole tile by the margin and the call (ceil(T / S) rounds of n) by the minimum gain.
constexpr SplitPlan plan_split(int tiles, int sms, int kv_tiles) {
    const int r = tiles >= sms ? tiles % sms : tiles;
    if (r == 0 || sms <= 0) return SplitPlan{tiles, 0, 1};
    int best_parts = 1, best_time = kv_tiles;  // g = 1: one round of whole tiles (r <= S)
    for (int g = 2; g <= kv_tiles / 2; ++g) {
        const int time = last_round_kv_tiles(r, g, sms, kv_tiles) + SPLIT_COST_KV_TILES;
        if (time < best_time) best_time = time, best_parts = g;
    }
    const int64_t rounds = (int64_t(tiles) + sms - 1) / sms;
    if (best_parts == 1 || best_time * 100 > (100 - SPLIT_MARGIN_PERCENT) * kv_tiles ||
        int64_t(kv_tiles - best_time) * 1000 < SPLIT_MIN_GAIN_PERMILLE * rounds * kv_tiles)
        return SplitPlan{tiles, 0, 1};
    return SplitPlan{tiles - r, r, best_parts};
}
// end excerpt
