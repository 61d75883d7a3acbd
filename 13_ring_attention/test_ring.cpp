// The ring's suite. Host cases (CI runs them): the merge rule against a direct softmax over the
// concatenated keys, the shardings and their index maps, the calls of every step, and the whole
// ring simulated on P virtual GPUs against the FP64 reference, forward and backward, and the
// checks of the ring's arguments. The GPU cases are in test_ring_gpu.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "merge.h"
#include "reference.h"
#include "ring.h"
#include "test_support.h"
#include "validate.h"

namespace {

constexpr Sharding kShardings[] = {Sharding::contiguous, Sharding::zigzag, Sharding::striped};

// softmax(scores) V and log-sum-exp, in FP64, over the keys with finite scores (a -inf score is
// a masked key). The yardstick of the merge cases.
void direct_softmax(const std::vector<double>& scores, const std::vector<double>& values, int64_t D,
                    std::vector<double>& o, double& lse) {
    double max = -INFINITY;
    for (double s : scores) max = std::max(max, s);
    o.assign(size_t(D), 0.0);
    if (max == -INFINITY) {
        lse = -INFINITY;
        return;
    }
    double sum = 0;
    for (size_t j = 0; j < scores.size(); ++j) {
        const double p = std::exp(scores[j] - max);
        sum += p;
        for (int64_t d = 0; d < D; ++d) o[size_t(d)] += p * values[j * size_t(D) + size_t(d)];
    }
    for (double& x : o) x /= sum;
    lse = max + std::log(sum);
}

double relative_error(const std::vector<double>& out, const std::vector<double>& ref) {
    return compare(out, ref).relative_l2;
}

// Inputs for `whole` (q, k, v and dO drawn from seeds seed .. seed + 3) and the FP64 reference
// forward and backward on them: the yardstick of the simulated backward's cases.
struct ReferenceCase {
    std::vector<float> q, k, v, dout;
    std::vector<double> o, lse, dq, dk, dv;
};

ReferenceCase reference_case(const AttentionShape& whole, uint64_t seed) {
    ReferenceCase c;
    c.q = random_inputs(size_t(whole.q_elements()), seed);
    c.k = random_inputs(size_t(whole.kv_elements()), seed + 1);
    c.v = random_inputs(size_t(whole.kv_elements()), seed + 2);
    c.dout = random_inputs(c.q.size(), seed + 3);
    c.o.resize(c.q.size());
    c.lse.resize(size_t(whole.lse_elements()));
    reference_forward(whole, c.q.data(), c.k.data(), c.v.data(), c.o.data(), c.lse.data());
    c.dq.resize(c.q.size());
    c.dk.resize(c.k.size());
    c.dv.resize(c.v.size());
    reference_backward(whole, c.q.data(), c.k.data(), c.v.data(), c.dout.data(), c.dq.data(), c.dk.data(),
                       c.dv.data());
    return c;
}

// Runs every call of the ring over P GPUs and N tokens (block_calls at each step, each GPU
// against the block it holds) and checks that each call stays inside its pieces and covers at
// most `cap` queries and keys (where cap > 0), and that together the calls compute every
// attended (query, key) pair exactly once and no other.
void check_calls_cover_every_pair_once(const std::vector<Shard>& shards, int64_t N, int P, bool causal,
                                       int64_t cap = 0) {
    std::vector<int> count(size_t(N * N), 0);
    for (int step = 0; step < P; ++step)
        for (int r = 0; r < P; ++r) {
            const int s = block_owner(r, step, P);
            for (const BlockCall& call : block_calls(shards[size_t(r)], shards[size_t(s)], causal)) {
                const Piece& qp = shards[size_t(r)].pieces[size_t(call.query_piece)];
                const Piece& kp = shards[size_t(s)].pieces[size_t(call.key_piece)];
                CHECK(call.query_begin + call.query_count <= qp.length);
                CHECK(call.key_begin + call.key_count <= kp.length);
                if (cap > 0) CHECK(call.query_count <= cap);
                if (cap > 0) CHECK(call.key_count <= cap);
                for (int64_t i = 0; i < call.query_count; ++i)
                    for (int64_t j = 0; j < call.key_count; ++j)
                        if (!call.causal || j <= i)
                            ++count[size_t(qp.position(call.query_begin + i) * N + kp.position(call.key_begin + j))];
            }
        }
    bool exact = true;
    for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < N; ++j) exact = exact && count[size_t(i * N + j)] == ((!causal || j <= i) ? 1 : 0);
    CHECK(exact);
}

}  // namespace

// ---- the merge rule ---------------------------------------------------------------------------

TEST_CASE("ring merge: blocks merged by log-sum-exp equal one softmax over the concatenated keys") {
    const uint64_t seed = fresh_seed();
    INFO("seed=", seed);
    std::mt19937_64 generator(seed);
    std::normal_distribution<double> normal(0.5, 3.0);
    for (int trial = 0; trial < 50; ++trial) {
        const int64_t D = trial % 2 ? 64 : 8, keys = 1 + int64_t(generator() % 200);
        std::vector<double> scores(static_cast<size_t>(keys)), values(size_t(keys * D));
        for (double& s : scores) s = normal(generator);
        for (double& x : values) x = normal(generator);
        // Masked keys (-inf) here and there; in a third of the trials a whole block of them.
        for (double& s : scores)
            if (generator() % 7 == 0) s = -INFINITY;
        // Cut the keys into blocks of random sizes; each block's state from its own softmax.
        std::vector<double> o_merged(size_t(D), 0.0), o_block;
        double lse_merged = -INFINITY, lse_block = 0;
        std::vector<int64_t> cuts{0};
        while (cuts.back() < keys) cuts.push_back(std::min(keys, cuts.back() + 1 + int64_t(generator() % 50)));
        if (trial % 3 == 0 && cuts.size() > 2)
            std::fill(scores.begin() + cuts[1], scores.begin() + cuts[2], -INFINITY);
        std::vector<size_t> order(cuts.size() - 1);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), generator);  // any order: the merge commutes
        for (size_t b : order) {
            const std::vector<double> block_scores(scores.begin() + cuts[b], scores.begin() + cuts[b + 1]);
            const std::vector<double> block_values(values.begin() + cuts[b] * D, values.begin() + cuts[b + 1] * D);
            direct_softmax(block_scores, block_values, D, o_block, lse_block);
            merge_rows(o_merged.data(), &lse_merged, o_block.data(), &lse_block, 1, D);
        }
        std::vector<double> o_direct;
        double lse_direct = 0;
        direct_softmax(scores, values, D, o_direct, lse_direct);
        INFO("trial ", trial, ": ", keys, " keys in ", order.size(), " blocks");
        if (lse_direct == -INFINITY) {
            CHECK(lse_merged == -INFINITY);
            CHECK(std::all_of(o_merged.begin(), o_merged.end(), [](double x) { return x == 0.0; }));
        } else {
            CHECK(lse_merged == doctest::Approx(lse_direct).epsilon(1e-13));
            CHECK(relative_error(o_merged, o_direct) < 1e-13);
        }
    }
}

TEST_CASE("ring merge: -inf rows and fully masked blocks change nothing and make no NaN") {
    const int64_t D = 4;
    const std::vector<double> o_seen{1, 2, 3, 4};
    const double nan = std::numeric_limits<double>::quiet_NaN();
    // A row that saw no key: LSE -inf, and an output nobody wrote (NaN here).
    const std::vector<double> o_unwritten{nan, nan, nan, nan};
    const double minus_inf = -INFINITY;

    std::vector<double> o = o_seen;
    double lse = 0.7;
    merge_rows(o.data(), &lse, o_unwritten.data(), &minus_inf, 1, D);
    CHECK(lse == 0.7);
    CHECK(o == o_seen);

    // Into the empty state (the accumulator before the first block): the block itself.
    o = o_unwritten;
    lse = -INFINITY;
    const double lse_seen = -3.25;
    merge_rows(o.data(), &lse, o_seen.data(), &lse_seen, 1, D);
    CHECK(lse == lse_seen);
    CHECK(o == o_seen);

    // Neither side has seen a key: still -inf, and zeros, not NaN.
    o = o_unwritten;
    lse = -INFINITY;
    merge_rows(o.data(), &lse, o_unwritten.data(), &minus_inf, 1, D);
    CHECK(lse == -INFINITY);
    CHECK(std::all_of(o.begin(), o.end(), [](double x) { return x == 0.0; }));

    // Two equal states: the same output, LSE + log 2.
    o = o_seen;
    lse = 1.5;
    const double same = 1.5;
    merge_rows(o.data(), &lse, o_seen.data(), &same, 1, D);
    CHECK(lse == doctest::Approx(1.5 + std::log(2.0)).epsilon(1e-15));
    for (int64_t d = 0; d < D; ++d) CHECK(o[size_t(d)] == doctest::Approx(o_seen[size_t(d)]).epsilon(1e-15));

    // Far apart (LSE 1000 against -1000): no overflow, the larger one wins outright.
    o = o_seen;
    lse = 1000;
    const std::vector<double> o_other{-1, -1, -1, -1};
    const double tiny = -1000;
    merge_rows(o.data(), &lse, o_other.data(), &tiny, 1, D);
    CHECK(lse == 1000);
    CHECK(o == o_seen);
}

TEST_CASE("ring merge: the FP32 merge the GPU runs stays within FP32 rounding of FP64") {
    const uint64_t seed = fresh_seed();
    INFO("seed=", seed);
    std::mt19937_64 generator(seed);
    std::normal_distribution<double> normal(0.0, 4.0);
    const int64_t rows = 512, D = 128, blocks = 8;
    std::vector<double> o64(size_t(rows * D), 0.0), lse64(size_t(rows), -INFINITY);
    std::vector<float> o32(o64.size(), 0.0f), lse32(size_t(rows), -INFINITY);
    for (int64_t b = 0; b < blocks; ++b) {
        std::vector<double> o_part(o64.size()), lse_part(static_cast<size_t>(rows));
        for (double& x : o_part) x = double(float(normal(generator) + 0.5));
        for (double& x : lse_part) x = double(float(normal(generator)));
        const std::vector<float> o_part32(o_part.begin(), o_part.end()), lse_part32(lse_part.begin(), lse_part.end());
        merge_rows(o64.data(), lse64.data(), o_part.data(), lse_part.data(), rows, D);
        merge_rows(o32.data(), lse32.data(), o_part32.data(), lse_part32.data(), rows, D);
    }
    const ErrorStats o_error = compare(o32, o64), lse_error = compare(lse32, lse64);
    INFO("o: ", o_error.to_string(), "; lse: ", lse_error.to_string());
    CHECK(o_error.relative_l2 < 1e-6);
    CHECK(lse_error.max_abs < 1e-5);
}

// ---- the shardings ----------------------------------------------------------------------------

TEST_CASE("ring sharding: every sharding is a permutation, and locate() is its inverse") {
    for (Sharding sharding : kShardings)
        for (int P = 1; P <= 8; ++P)
            for (int64_t N : {int64_t(1), int64_t(2), int64_t(7), int64_t(15), int64_t(16), int64_t(17),
                              int64_t(64), int64_t(97), int64_t(1000), int64_t(4099)}) {
                INFO(std::string(sharding_name(sharding)), " P=", P, " N=", N);
                const std::vector<Shard> shards = make_shards(sharding, N, P);
                REQUIRE(shards.size() == size_t(P));
                std::vector<int> seen(size_t(N), 0);
                int64_t total = 0;
                bool inverse = true;
                for (int d = 0; d < P; ++d) {
                    total += shards[size_t(d)].length();
                    for (int64_t i = 0; i < shards[size_t(d)].length(); ++i) {
                        const int64_t g = global_position(shards, d, i);
                        REQUIRE(g >= 0);
                        REQUIRE(g < N);
                        ++seen[size_t(g)];
                        const Location back = locate(sharding, N, P, g);
                        inverse = inverse && back.device == d && back.local == i;
                    }
                }
                CHECK(total == N);
                CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
                CHECK(inverse);
                // Shards differ in length by at most one token (two for zigzag's two pieces).
                int64_t longest = 0, shortest = N;
                for (const Shard& s : shards) {
                    longest = std::max(longest, s.length());
                    shortest = std::min(shortest, s.length());
                }
                CHECK(longest - shortest <= (sharding == Sharding::zigzag ? 2 : 1));
            }
    CHECK(parse_sharding("zigzag") == Sharding::zigzag);
    CHECK_THROWS_AS(parse_sharding("diagonal"), std::invalid_argument);
    CHECK_THROWS_AS(make_shards(Sharding::zigzag, 0, 2), std::invalid_argument);
    CHECK_THROWS_AS(make_shards(Sharding::zigzag, 5, 0), std::invalid_argument);
}

TEST_CASE("ring sharding: the layouts round-trip, piece by piece") {
    const int64_t BH = 3, N = 23, W = 5;
    std::vector<float> whole(size_t(BH * N * W));
    std::iota(whole.begin(), whole.end(), 0.0f);
    for (Sharding sharding : kShardings)
        for (int P : {1, 2, 3, 4, 8}) {
            const std::vector<Shard> shards = make_shards(sharding, N, P);
            const auto local = shard_rows(whole, shards, BH, N, W);
            // Row i of piece p, head h, holds the whole tensor's row at the piece's i-th position.
            for (int d = 0; d < P; ++d)
                for (int p = 0; p < int(shards[size_t(d)].pieces.size()); ++p)
                    for (int64_t h = 0; h < BH; ++h)
                        for (int64_t i = 0; i < shards[size_t(d)].pieces[size_t(p)].length; ++i)
                            CHECK(local[size_t(d)][size_t(piece_row_offset(shards[size_t(d)], p, BH, h, i, W))] ==
                                  whole[size_t((h * N + shards[size_t(d)].pieces[size_t(p)].position(i)) * W)]);
            CHECK(unshard_rows(local, shards, BH, N, W) == whole);
        }
}

// Under the causal mask GPU r's queries see sum over its tokens of (position + 1) keys. The
// balanced shardings keep every GPU within 2N pairs (zigzag) or N pairs (striped) of every
// other, against a mean of N (N + 1) / (2P): within 4P / N of each other. And every step is
// balanced too, within N pairs, against a mean per step of about N^2 / (2 P^2): the ring moves
// in lockstep, so a step is as slow as its slowest GPU. Contiguous sharding is neither.
TEST_CASE("ring sharding: zigzag and striped balance the causal work, in total and per step") {
    auto pairs_of = [](const Shard& shard) {
        int64_t pairs = 0;
        for (const Piece& piece : shard.pieces)
            for (int64_t i = 0; i < piece.length; ++i) pairs += piece.position(i) + 1;
        return pairs;
    };
    for (int P = 2; P <= 8; ++P)
        for (int64_t N = 1; N <= 600; N += (N < 100 ? 1 : 37)) {
            for (Sharding sharding : {Sharding::zigzag, Sharding::striped}) {
                INFO(std::string(sharding_name(sharding)), " P=", P, " N=", N);
                const std::vector<Shard> shards = make_shards(sharding, N, P);
                std::vector<int64_t> total;
                for (const Shard& shard : shards) total.push_back(pairs_of(shard));
                const int64_t spread = *std::max_element(total.begin(), total.end()) -
                                       *std::min_element(total.begin(), total.end());
                CHECK(spread <= (sharding == Sharding::zigzag ? 2 * N : N));
                // The calls of all steps add up to the same totals, and each step is balanced.
                const auto work = step_work(shards, /*causal=*/true);
                std::vector<int64_t> summed(size_t(P), 0);
                for (const auto& step : work) {
                    CHECK(*std::max_element(step.begin(), step.end()) -
                              *std::min_element(step.begin(), step.end()) <= N);
                    for (int d = 0; d < P; ++d) summed[size_t(d)] += step[size_t(d)];
                }
                CHECK(summed == total);
            }
        }
    // Contiguous: the last GPU does (2P - 1) times the first one's work; at P = 4, N = 4096,
    // the slowest step has a whole block where other GPUs have none.
    const std::vector<Shard> contiguous = make_shards(Sharding::contiguous, 4096, 4);
    const auto work = step_work(contiguous, true);
    int64_t first = 0, last = 0;
    for (const auto& step : work) {
        first += step[0];
        last += step[3];
    }
    CHECK(double(last) / double(first) == doctest::Approx(7.0).epsilon(0.01));
    CHECK(work[1][0] == 0);
    CHECK(work[1][1] == 1024 * 1024);
}

TEST_CASE("ring calls: over all steps every attended (query, key) pair is computed exactly once") {
    for (Sharding sharding : kShardings)
        for (bool causal : {false, true})
            for (int P : {1, 2, 3, 4, 8})
                for (int64_t N : {int64_t(1), int64_t(3), int64_t(16), int64_t(17), int64_t(41)}) {
                    INFO(std::string(sharding_name(sharding)), " P=", P, " N=", N,
                         std::string(causal ? " causal" : ""));
                    check_calls_cover_every_pair_once(make_shards(sharding, N, P), N, P, causal);
                }
    // Zigzag's steps: the GPU's own block is three calls (two diagonals, one full); a block from
    // an earlier GPU is seen by all its queries against its first piece; from a later GPU by its
    // second piece against the whole block.
    const std::vector<Shard> shards = make_shards(Sharding::zigzag, 64, 4);  // chunks of 8
    CHECK(block_calls(shards[1], shards[1], true).size() == 3);
    const auto earlier = block_calls(shards[2], shards[0], true);
    REQUIRE(earlier.size() == 2);
    CHECK((earlier[0].key_piece == 0 && earlier[1].key_piece == 0 && !earlier[0].causal));
    const auto later = block_calls(shards[0], shards[2], true);
    REQUIRE(later.size() == 2);
    CHECK((later[0].query_piece == 1 && later[1].query_piece == 1 && !later[1].causal));
}

TEST_CASE("ring calls: keys are whole pieces, and a GPU's calls take one slice of query rows at most") {
    // What attention.cu relies on: no key piece is ever copied, and the one query slice (striped's
    // shifted rows, from step 1 on) is copied once per ring call, while step 0 computes.
    for (Sharding sharding : kShardings)
        for (bool causal : {false, true})
            for (int P : {1, 2, 3, 4, 8})
                for (int64_t N : {int64_t(1), int64_t(7), int64_t(16), int64_t(17), int64_t(41), int64_t(1031)}) {
                    INFO(std::string(sharding_name(sharding)), " P=", P, " N=", N,
                         std::string(causal ? " causal" : ""));
                    const std::vector<Shard> shards = make_shards(sharding, N, P);
                    for (int r = 0; r < P; ++r) {
                        std::vector<std::pair<int64_t, int64_t>> slices;  // (begin, count) of partial query rows
                        for (int step = 0; step < P; ++step) {
                            const int s = block_owner(r, step, P);
                            for (const BlockCall& call : block_calls(shards[size_t(r)], shards[size_t(s)], causal)) {
                                const Piece& qp = shards[size_t(r)].pieces[size_t(call.query_piece)];
                                const Piece& kp = shards[size_t(s)].pieces[size_t(call.key_piece)];
                                CHECK(call.key_begin == 0);
                                CHECK(call.key_count == kp.length);
                                if (call.query_count == qp.length) continue;
                                CHECK(step > 0);  // the GPU's own block: whole pieces
                                if (std::find(slices.begin(), slices.end(),
                                              std::pair{call.query_begin, call.query_count}) == slices.end())
                                    slices.emplace_back(call.query_begin, call.query_count);
                            }
                        }
                        CHECK(slices.size() <= 1);
                    }
                }
}

// Pieces cut at max_piece (kRingMaxPiece on the GPU): the same tokens in the same order on each
// GPU, runs of at most max_piece tokens (striped's strided piece whole), of nearly equal length,
// and calls that still compute every attended pair once.
TEST_CASE("ring sharding: runs cut at max_piece keep every token where it was, and the calls still cover every pair once") {
    for (Sharding sharding : kShardings)
        for (int P : {1, 2, 3, 4})
            for (int64_t N : {int64_t(1), int64_t(17), int64_t(64), int64_t(97)})
                for (int64_t cap : {int64_t(1), int64_t(3), int64_t(5), int64_t(16)}) {
                    INFO(std::string(sharding_name(sharding)), " P=", P, " N=", N, " max_piece=", cap);
                    const std::vector<Shard> whole_runs = make_shards(sharding, N, P, 0);
                    const std::vector<Shard> cut = make_shards(sharding, N, P, cap);
                    for (int d = 0; d < P; ++d) {
                        REQUIRE(cut[size_t(d)].length() == whole_runs[size_t(d)].length());
                        for (int64_t i = 0; i < cut[size_t(d)].length(); ++i)
                            CHECK(global_position(cut, d, i) == global_position(whole_runs, d, i));
                        for (const Piece& piece : cut[size_t(d)].pieces)
                            CHECK((sharding == Sharding::striped || piece.length <= cap));
                        // A run is cut into pieces that differ by one token at most.
                        if (sharding == Sharding::contiguous && cut[size_t(d)].pieces.size() > 1) {
                            int64_t longest = 0, shortest = N;
                            for (const Piece& piece : cut[size_t(d)].pieces) {
                                longest = std::max(longest, piece.length);
                                shortest = std::min(shortest, piece.length);
                            }
                            CHECK(longest - shortest <= 1);
                        }
                        if (sharding == Sharding::striped) CHECK(cut[size_t(d)].pieces.size() == 1);
                    }
                    for (bool causal : {false, true})  // striped's pieces are never cut
                        check_calls_cover_every_pair_once(cut, N, P, causal, sharding == Sharding::striped ? 0 : cap);
                }
    CHECK_THROWS_AS(make_shards(Sharding::contiguous, 10, 2, -1), std::invalid_argument);
    // The default cuts only runs longer than kRingMaxPiece.
    CHECK(make_shards(Sharding::contiguous, 2 * kRingMaxPiece, 2)[0].pieces.size() == 1);
    CHECK(make_shards(Sharding::contiguous, 2 * kRingMaxPiece + 2, 2)[0].pieces.size() == 2);
}

// ---- the ring simulated on the host ---------------------------------------------------------

TEST_CASE("ring simulated: forward on P virtual GPUs equals the FP64 reference on the whole sequence") {
    const uint64_t seed = fresh_seed();
    INFO("seed=", seed);
    int cases = 0;
    for (int head_dim : {64, 128})
        for (bool causal : {false, true})
            for (int64_t N : {1, 2, 17, 33, 64, 127})
                for (int P : {2, 3, 4, 8})
                    for (Sharding sharding : kShardings) {
                        const AttentionShape whole = make_shape(2, 1, int(N), int(N), head_dim, causal);
                        const uint64_t s = seed + uint64_t(++cases) * 7;
                        const auto q = random_inputs(size_t(whole.q_elements()), s);
                        const auto k = random_inputs(size_t(whole.kv_elements()), s + 1);
                        const auto v = random_inputs(size_t(whole.kv_elements()), s + 2);
                        std::vector<double> o(q.size()), lse(size_t(whole.lse_elements()));
                        reference_forward(whole, q.data(), k.data(), v.data(), o.data(), lse.data());
                        const RingResult ring = simulate_ring_forward(whole, sharding, P, q, k, v);
                        INFO(whole.to_string(), " P=", P, " ", std::string(sharding_name(sharding)));
                        CHECK(relative_error(ring.o, o) < 1e-12);
                        CHECK(compare(ring.lse, lse).max_abs < 1e-12);
                    }
    CHECK(cases == 2 * 2 * 6 * 4 * 3);
}

TEST_CASE("ring simulated: with runs cut at max_piece, forward and backward equal the FP64 reference") {
    const uint64_t seed = fresh_seed();
    INFO("seed=", seed);
    int cases = 0;
    for (bool causal : {false, true})
        for (int P : {2, 3})
            for (Sharding sharding : {Sharding::contiguous, Sharding::zigzag})
                for (int64_t cap : {int64_t(4), int64_t(7)}) {
                    const AttentionShape whole = make_shape(1, 2, 41, 41, 64, causal);
                    const ReferenceCase r = reference_case(whole, seed + uint64_t(++cases) * 13);
                    INFO(whole.to_string(), " P=", P, " ", std::string(sharding_name(sharding)), " max_piece=", cap);
                    const RingResult forward = simulate_ring_forward(whole, sharding, P, r.q, r.k, r.v, false, cap);
                    CHECK(relative_error(forward.o, r.o) < 1e-12);
                    CHECK(compare(forward.lse, r.lse).max_abs < 1e-12);
                    const RingResult fp32 = simulate_ring_forward(whole, sharding, P, r.q, r.k, r.v, true, cap);
                    CHECK(relative_error(fp32.o, r.o) < 1e-6);
                    const RingResult backward =
                        simulate_ring_backward(whole, sharding, P, r.q, r.k, r.v, r.o, r.lse, r.dout,
                                               DeltaSource::whole_row, DqCentring::none, cap);
                    CHECK(relative_error(backward.dq, r.dq) < 1e-11);
                    CHECK(relative_error(backward.dk, r.dk) < 1e-11);
                    CHECK(relative_error(backward.dv, r.dv) < 1e-11);
                }
    CHECK(cases == 2 * 2 * 2 * 2);
}

TEST_CASE("ring simulated: merged in FP32 as on the GPU, the forward stays within 1e-6") {
    const uint64_t seed = fresh_seed();
    INFO("seed=", seed);
    for (Sharding sharding : kShardings)
        for (bool causal : {false, true}) {
            const AttentionShape whole = make_shape(1, 2, 301, 301, 64, causal);
            const auto q = random_inputs(size_t(whole.q_elements()), seed);
            const auto k = random_inputs(size_t(whole.kv_elements()), seed + 1);
            const auto v = random_inputs(size_t(whole.kv_elements()), seed + 2);
            std::vector<double> o(q.size()), lse(size_t(whole.lse_elements()));
            reference_forward(whole, q.data(), k.data(), v.data(), o.data(), lse.data());
            const RingResult ring = simulate_ring_forward(whole, sharding, 8, q, k, v, /*fp32_merge=*/true);
            INFO(whole.to_string(), " ", std::string(sharding_name(sharding)));
            CHECK(relative_error(ring.o, o) < 1e-6);
            CHECK(compare(ring.lse, lse).relative_l2 < 1e-6);
        }
}

TEST_CASE("ring simulated: backward, dQ at home and dK, dV carried round, equals the whole-sequence FP64 gradients") {
    const uint64_t seed = fresh_seed();
    INFO("seed=", seed);
    int cases = 0;
    for (int head_dim : {64, 128})
        for (bool causal : {false, true})
            for (int64_t N : {1, 17, 33, 65})
                for (int P : {2, 3, 4, 8})
                    for (Sharding sharding : kShardings) {
                        const AttentionShape whole = make_shape(1, 2, int(N), int(N), head_dim, causal);
                        const ReferenceCase r = reference_case(whole, seed + uint64_t(++cases) * 11);
                        const RingResult ring =
                            simulate_ring_backward(whole, sharding, P, r.q, r.k, r.v, r.o, r.lse, r.dout);
                        INFO(whole.to_string(), " P=", P, " ", std::string(sharding_name(sharding)));
                        CHECK(relative_error(ring.dq, r.dq) < 1e-11);
                        CHECK(relative_error(ring.dk, r.dk) < 1e-11);
                        CHECK(relative_error(ring.dv, r.dv) < 1e-11);
                    }
    CHECK(cases == 2 * 2 * 4 * 4 * 3);
}

// Why the ring refuses blocks of 128 keys or fewer in the backward: stage 11 then takes delta as
// the sum of P * dP over the block's own keys, which equals rowsum(dO * O) only when the block
// holds every key the row sees. One GPU: right. A ring of two: dQ and dK go wrong (dV, which
// does not involve delta, stays right).
TEST_CASE("ring simulated: delta summed over a block's own keys is right on one GPU and wrong on a ring") {
    const uint64_t seed = fresh_seed();
    INFO("seed=", seed);
    const AttentionShape whole = make_shape(1, 2, 40, 40, 64, /*causal=*/true);
    const ReferenceCase r = reference_case(whole, seed);

    const RingResult one = simulate_ring_backward(whole, Sharding::contiguous, 1, r.q, r.k, r.v, r.o, r.lse, r.dout,
                                                  DeltaSource::block_keys);
    CHECK(relative_error(one.dq, r.dq) < 1e-11);
    CHECK(relative_error(one.dk, r.dk) < 1e-11);
    const RingResult ring = simulate_ring_backward(whole, Sharding::zigzag, 2, r.q, r.k, r.v, r.o, r.lse, r.dout,
                                                   DeltaSource::block_keys);
    CHECK(relative_error(ring.dq, r.dq) > 1e-3);
    CHECK(relative_error(ring.dk, r.dk) > 1e-3);
    CHECK(relative_error(ring.dv, r.dv) < 1e-11);
    // The smallest call of a ring, which the GPU ring's backward checks against 129 keys.
    CHECK(smallest_call_keys(make_shape(1, 1, 1032, 1032, 64, true), Sharding::zigzag, 4) == 129);
    CHECK(smallest_call_keys(make_shape(1, 1, 1031, 1031, 64, true), Sharding::zigzag, 4) == 128);
    CHECK(smallest_call_keys(make_shape(1, 1, 1031, 1031, 64, false), Sharding::striped, 4) == 257);
}

// The centring of dQ (DqCentring). Stage 11 returns dQ_i = scale (sum_j dS_ij K_j - rowsum(dS)_i c)
// with c the mean of the call's keys. Over a whole row rowsum(dS) = 0 and c changes nothing (in
// exact arithmetic); over a ring's block it does not vanish, so calls whose keys have different
// means leave their sum off by scale sum_b rowsum_b(dS) c_b, with no rounding involved at all.
// The keys here are moved by a different constant on every GPU (offset_keys_by_gpu). The GPU ring
// gives every call the same c, the mean of all keys (stage 11's key_centre).
TEST_CASE("ring simulated: dQ centred by each call's key mean is wrong over a ring; every call centred by the "
          "mean of all keys is exact, and is stage 11's centring") {
    const uint64_t seed = fresh_seed();
    INFO("seed=", seed);
    int cases = 0;
    for (bool causal : {false, true})
        for (int P : {2, 4})
            for (Sharding sharding : kShardings) {
                const AttentionShape whole = make_shape(1, 2, 150, 150, 64, causal);
                const uint64_t s = seed + uint64_t(++cases) * 13;
                INFO(whole.to_string(), " P=", P, " ", std::string(sharding_name(sharding)));
                const auto q = random_inputs(size_t(whole.q_elements()), s);
                const auto k = offset_keys_by_gpu(random_inputs(size_t(whole.kv_elements()), s + 1), whole, sharding,
                                                  P, 0.25f);
                const auto v = random_inputs(size_t(whole.kv_elements()), s + 2);
                const auto dout = random_inputs(q.size(), s + 3);
                std::vector<double> o(q.size()), lse(size_t(whole.lse_elements()));
                reference_forward(whole, q.data(), k.data(), v.data(), o.data(), lse.data());
                std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
                reference_backward(whole, q.data(), k.data(), v.data(), dout.data(), dq.data(), dk.data(), dv.data());
                auto run = [&](const std::vector<double>& o_given, Sharding how, int gpus, DqCentring centring) {
                    return simulate_ring_backward(whole, how, gpus, q, k, v, o_given, lse, dout, DeltaSource::whole_row,
                                                  centring);
                };
                // Exact arithmetic: one call over the whole sequence is right whatever its c...
                CHECK(relative_error(run(o, Sharding::contiguous, 1, DqCentring::per_call).dq, dq) < 1e-11);
                // ... a ring's calls, each centred by its own keys' mean, are not (dQ alone: dK and
                // dV do not involve c) ...
                const RingResult per_call = run(o, sharding, P, DqCentring::per_call);
                CHECK(relative_error(per_call.dq, dq) > 1e-2);
                CHECK(relative_error(per_call.dk, dk) < 1e-11);
                CHECK(relative_error(per_call.dv, dv) < 1e-11);
                // ... and every call centred by the mean of all keys is (the keys as given: no
                // rounding beyond FP64's).
                const RingResult whole_keys = run(o, sharding, P, DqCentring::whole_keys);
                CHECK(relative_error(whole_keys.dq, dq) < 1e-11);
                CHECK(relative_error(whole_keys.dk, dk) < 1e-11);
                CHECK(relative_error(whole_keys.dv, dv) < 1e-11);

                // With O rounded to bf16, as the GPU's, delta is off and rowsum(dS) != 0 even over a
                // whole row: the centring then matters. The ring's dQ is stage 11's centred dQ on the
                // whole sequence (c = the mean of all keys), not the uncentred one.
                const std::vector<float> o_float(o.begin(), o.end());
                const std::vector<float> o_rounded = rounded_to_bf16(o_float);
                const std::vector<double> o_bf16(o_rounded.begin(), o_rounded.end());
                const RingResult single = run(o_bf16, Sharding::contiguous, 1, DqCentring::per_call);
                const double kept = relative_error(run(o_bf16, sharding, P, DqCentring::whole_keys).dq, single.dq);
                const double uncentred = relative_error(run(o_bf16, sharding, P, DqCentring::none).dq, single.dq);
                INFO("against stage 11's centring on the whole sequence: the ring's ", kept, ", uncentred ", uncentred);
                CHECK(kept < 1e-11);
                CHECK(uncentred > 1e-4);
            }
    CHECK(cases == 2 * 2 * 3);
}

// The ring's key centre on the host: the means of all keys from every GPU's sums (as its
// all-reduce adds them), GPUs with no token included, against the means of the whole tensor.
TEST_CASE("ring simulated: the mean of all keys from every GPU's column sums, GPUs with no token included") {
    const uint64_t seed = fresh_seed();
    INFO("seed=", seed);
    // The means, from the shards, for every sharding, with GPUs that hold nothing (5 tokens on 8).
    for (int64_t N : {5, 97})
        for (int P : {1, 2, 3, 8})
            for (Sharding sharding : kShardings) {
                const AttentionShape whole = make_shape(2, 3, int(N), int(N), 64);
                const int64_t BH = 6, D = 64;
                const auto k = offset_keys_by_gpu(random_inputs(size_t(whole.kv_elements()), seed + uint64_t(N)),
                                                  whole, sharding, P, 0.25f);
                const std::vector<Shard> shards = make_shards(sharding, N, P);
                const std::vector<double> means = whole_key_means(shard_rows(k, shards, BH, N, D), shards, BH, D, N);
                INFO("N=", N, " P=", P, " ", std::string(sharding_name(sharding)));
                double worst = 0;
                for (int64_t h = 0; h < BH; ++h)
                    for (int64_t d = 0; d < D; ++d) {
                        double direct = 0;
                        for (int64_t j = 0; j < N; ++j) direct += k[size_t((h * N + j) * D + d)];
                        worst = std::max(worst, std::abs(means[size_t(h * D + d)] - direct / double(N)));
                    }
                CHECK(worst < 1e-12);
            }
}

TEST_CASE("ring simulated: a ring of one GPU is the whole-sequence attention, and len_q != len_kv is refused") {
    const AttentionShape whole = make_shape(2, 2, 29, 29, 64, true);
    const auto q = random_inputs(size_t(whole.q_elements()), 1);
    const auto k = random_inputs(size_t(whole.kv_elements()), 2);
    const auto v = random_inputs(size_t(whole.kv_elements()), 3);
    std::vector<double> o(q.size()), lse(size_t(whole.lse_elements()));
    reference_forward(whole, q.data(), k.data(), v.data(), o.data(), lse.data());
    for (Sharding sharding : kShardings)
        CHECK(relative_error(simulate_ring_forward(whole, sharding, 1, q, k, v).o, o) < 1e-13);
    const AttentionShape cross = make_shape(1, 1, 29, 30, 64);
    CHECK_THROWS_AS(simulate_ring_forward(cross, Sharding::zigzag, 2, q, k, v), std::invalid_argument);
}

// ---- the checks of a GPU ring call --------------------------------------------------------------

TEST_CASE("ring arguments: refused before anything runs, naming the field and what is allowed") {
    const void* aligned = reinterpret_cast<const void*>(uintptr_t(0x10000));
    const void* odd = reinterpret_cast<const void*>(uintptr_t(0x10002));
    auto tensors = [&](const void* last) {
        return RingTensors{{"q", {aligned, aligned}}, {"k", {aligned, last}}};
    };
    const RingTensors lse{{"lse", {aligned, aligned}}};
    const AttentionShape whole = make_shape(1, 2, 1031, 1031, 128, true);
    auto message = [&](const AttentionShape& shape, int devices, const RingTensors& bf16_tensors,
                       const RingTensors& fp32_tensors, bool backward, Sharding sharding = Sharding::zigzag) {
        try {
            validate_ring(shape, sharding, devices, bf16_tensors, fp32_tensors, backward);
        } catch (const std::invalid_argument& error) {
            return std::string(error.what());
        }
        return std::string("(accepted)");
    };
    CHECK(message(whole, 2, tensors(aligned), lse, true) == "(accepted)");
    CHECK(message(whole, 2, tensors(nullptr), lse, false).find("k[1] = null") != std::string::npos);
    CHECK(message(whole, 2, tensors(odd), lse, false).find("k[1]") != std::string::npos);
    CHECK(message(whole, 2, tensors(aligned), {{"lse", {aligned}}}, false).find("lse has 1 pointers") !=
          std::string::npos);
    CHECK(message(make_shape(1, 2, 1031, 1030, 128, true), 2, tensors(aligned), lse, false).find("len_q == len_kv") !=
          std::string::npos);
    CHECK(message(make_shape(1, 2, 1031, 1031, 96, true), 2, tensors(aligned), lse, false).find("head_dim") !=
          std::string::npos);
    CHECK(message(whole, 0, {}, {}, false).find("devices = 0") != std::string::npos);
    // 1031 tokens over 4 GPUs, zigzag: chunks of 128 and 129. The forward takes any length; the
    // backward refuses calls of 128 keys.
    const RingTensors four{{"q", {aligned, aligned, aligned, aligned}}};
    CHECK(message(whole, 4, four, {}, false) == "(accepted)");
    CHECK(message(whole, 4, four, {}, true).find("calls of 128 keys") != std::string::npos);
    // A GPU that holds no token may pass null.
    CHECK(message(make_shape(1, 1, 3, 3, 64, false), 4, {{"q", {aligned, aligned, aligned, nullptr}}}, {}, false,
                  Sharding::contiguous) == "(accepted)");
}
