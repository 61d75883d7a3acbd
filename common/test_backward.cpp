// The shared backward suite, compiled only into stages that define attention_backward
// (BACKWARD := 1 in their Makefile). Host cases check the FP64 reference backward itself;
// GPU cases compare the stage's dQ, dK, dV with it over the shape matrix of DESIGN.md.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "reference.h"
#include "stage_name.h"
#include "test_support.h"
#include "validate.h"

namespace {

// ---- host: the reference backward is the gradient of the reference forward --------------

// loss = sum(dout * O) in FP64, O from the reference forward.
double reference_loss(const AttentionShape& shape, const std::vector<float>& q,
                      const std::vector<float>& k, const std::vector<float>& v,
                      const std::vector<float>& dout) {
    std::vector<double> o(q.size());
    reference_forward(shape, q.data(), k.data(), v.data(), o.data(), nullptr);
    double loss = 0;
    for (size_t i = 0; i < o.size(); ++i) loss += double(dout[i]) * o[i];
    return loss;
}

// Central differences of the loss with respect to every element of one input. The step is a
// power of two, so input +- step is exact in float and the only error is the O(step^2) term.
// 2^-16: with 2^-12 that term reached 6.9e-6 of the gradient's norm for some random inputs,
// over the test's 1e-6 (one failure in the device runs of 2026-11-22); the FP64 rounding of the loss
// stays far below it at either step.
std::vector<double> finite_difference(const AttentionShape& shape, std::vector<float>& q,
                                      std::vector<float>& k, std::vector<float>& v,
                                      const std::vector<float>& dout, std::vector<float>& input) {
    const float step = std::ldexp(1.0f, -16);
    std::vector<double> gradient(input.size());
    for (size_t i = 0; i < input.size(); ++i) {
        const float saved = input[i];
        input[i] = saved + step;
        const double up = reference_loss(shape, q, k, v, dout);
        input[i] = saved - step;
        const double down = reference_loss(shape, q, k, v, dout);
        input[i] = saved;
        gradient[i] = (up - down) / (2.0 * double(step));
    }
    return gradient;
}

}  // namespace

TEST_CASE("reference backward: dQ, dK, dV match finite differences of the reference forward") {
    for (bool causal : {false, true})
        for (auto [len_q, len_kv] : {std::pair{3, 4}, std::pair{4, 3}}) {
            const AttentionShape shape = make_shape(1, 1, len_q, len_kv, 4, causal);
            const uint64_t seed = fresh_seed();
            INFO(shape.to_string(), " seed=", seed);
            std::vector<float> q = random_inputs(size_t(shape.q_elements()), seed);
            std::vector<float> k = random_inputs(size_t(shape.kv_elements()), seed + 1);
            std::vector<float> v = random_inputs(size_t(shape.kv_elements()), seed + 2);
            const std::vector<float> dout = random_inputs(q.size(), seed + 3);

            std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
            reference_backward(shape, q.data(), k.data(), v.data(), dout.data(), dq.data(),
                               dk.data(), dv.data());
            const ErrorStats dq_error = compare(dq, finite_difference(shape, q, k, v, dout, q));
            const ErrorStats dk_error = compare(dk, finite_difference(shape, q, k, v, dout, k));
            const ErrorStats dv_error = compare(dv, finite_difference(shape, q, k, v, dout, v));
            INFO("against finite differences: dq ", dq_error.to_string(), "; dk ",
                 dk_error.to_string(), "; dv ", dv_error.to_string());
            for (const ErrorStats& error : {dq_error, dk_error, dv_error}) {
                CHECK(error.non_finite == 0);
                CHECK(error.relative_l2 < 1e-6);
            }
        }
}

TEST_CASE("reference backward: rowsum(P * dP) equals rowsum(dO * O)") {
    // The identity that lets the GPU compute D from O and dO alone, before any P exists.
    for (bool causal : {false, true}) {
        const AttentionShape shape = make_shape(2, 2, 9, 13, 8, causal);
        const uint64_t seed = fresh_seed();
        INFO(shape.to_string(), " seed=", seed);
        const std::vector<float> q = random_inputs(size_t(shape.q_elements()), seed);
        const std::vector<float> k = random_inputs(size_t(shape.kv_elements()), seed + 1);
        const std::vector<float> v = random_inputs(size_t(shape.kv_elements()), seed + 2);
        const std::vector<float> dout = random_inputs(q.size(), seed + 3);
        std::vector<double> o(q.size()), lse(size_t(shape.lse_elements()));
        reference_forward(shape, q.data(), k.data(), v.data(), o.data(), lse.data());

        const int64_t D = shape.head_dim, Lq = shape.len_q, Lk = shape.len_kv;
        const double scale = shape.softmax_scale();
        for (int64_t row = 0; row < shape.lse_elements(); ++row) {
            const int64_t head = row / Lq, i = row % Lq;
            double do_dot_o = 0;
            for (int64_t d = 0; d < D; ++d) do_dot_o += double(dout[size_t(row * D + d)]) * o[size_t(row * D + d)];
            double p_dot_dp = 0, p_sum = 0;
            for (int64_t j = 0; j < Lk; ++j) {
                if (causal && j > i) continue;
                double s = 0, dp = 0;
                for (int64_t d = 0; d < D; ++d) {
                    const size_t key = size_t((head * Lk + j) * D + d);
                    s += double(q[size_t(row * D + d)]) * k[key];
                    dp += double(dout[size_t(row * D + d)]) * v[key];
                }
                const double p = std::exp(s * scale - lse[size_t(row)]);
                p_sum += p;
                p_dot_dp += p * dp;
            }
            CHECK(p_sum == doctest::Approx(1.0).epsilon(1e-12));
            CHECK(p_dot_dp == doctest::Approx(do_dot_o).epsilon(1e-10));
        }
    }
}

#if defined(ATTENTION_HAS_BACKWARD)

namespace {

void check_gradient(const char* name, std::vector<Element> raw, size_t count,
                    const std::vector<double>& ref) {
    INFO(std::string(name));
    CHECK_MESSAGE(still_poisoned(raw.data() + count, kGuard * sizeof(Element)),
                  name, " was written past its end");
    raw.resize(count);
    const ErrorStats error = compare(to_float(raw), ref);
    INFO(std::string(name), ": ", error.to_string());
    CHECK(error.non_finite == 0);
    CHECK(error.relative_l2 <= tolerance());
}

// dQ, dK and dV as downloaded, each with its kGuard poisoned elements after the end.
struct Gradients {
    std::vector<Element> dq, dk, dv;
};

// One backward case: fresh random inputs (rounded as the stage sees them) on the device, O and
// LSE from the stage's own forward, and the FP64 reference gradients. run() may be called again
// and again on the same inputs. K is randn + key_mean (the suite's 0.5 unless asked otherwise).
class BackwardCase {
public:
    explicit BackwardCase(const AttentionShape& shape, uint64_t seed = fresh_seed(), float key_mean = 0.5f)
        : shape_(shape),
          seed_(seed),
          key_mean_(key_mean),
          q_(stage_inputs(size_t(shape.q_elements()), seed_)),
          k_(stage_inputs(size_t(shape.kv_elements()), seed_ + 1, key_mean)),
          v_(stage_inputs(size_t(shape.kv_elements()), seed_ + 2)),
          dout_(stage_inputs(q_.size(), seed_ + 3)),
          q_dev_(q_.size()), k_dev_(k_.size()), v_dev_(v_.size()), do_dev_(q_.size()),
          o_dev_(q_.size()), lse_dev_(size_t(shape.lse_elements())),
          dq_ref_(q_.size()), dk_ref_(k_.size()), dv_ref_(v_.size()) {
        q_dev_.upload(from_float<Element>(q_));
        k_dev_.upload(from_float<Element>(k_));
        v_dev_.upload(from_float<Element>(v_));
        do_dev_.upload(from_float<Element>(dout_));
        // The stage's own forward produces the O and LSE its backward consumes. Poisoned first:
        // an element the forward leaves unwritten turns the gradients into NaN; and initcheck,
        // blind to the copy engine's writes (11's forward stores O by TMA), sees O initialized.
        o_dev_.poison();
        lse_dev_.poison();
        attention_forward(q_dev_.data(), k_dev_.data(), v_dev_.data(), o_dev_.data(),
                          lse_dev_.data(), shape_);
        reference_backward(shape_, q_.data(), k_.data(), v_.data(), dout_.data(), dq_ref_.data(),
                           dk_ref_.data(), dv_ref_.data());
    }

    // The stage's backward into NaN-poisoned dQ, dK, dV with guard elements after the end.
    Gradients run(const float* key_centre = nullptr) const {
        DeviceBuffer<Element> dq_dev(q_.size() + kGuard), dk_dev(k_.size() + kGuard),
            dv_dev(v_.size() + kGuard);
        dq_dev.poison();
        dk_dev.poison();
        dv_dev.poison();
        attention_backward(q_dev_.data(), k_dev_.data(), v_dev_.data(), o_dev_.data(),
                           lse_dev_.data(), do_dev_.data(), dq_dev.data(), dk_dev.data(),
                           dv_dev.data(), shape_, 0, key_centre);
        CUDA_CHECK(cudaDeviceSynchronize());
        return {dq_dev.download(), dk_dev.download(), dv_dev.download()};
    }

    // What a failure report names (the caller puts it in an INFO).
    std::string describe() const {
        return std::string(attention_stage_name()) + " backward " + shape_.to_string() +
               " seed=" + std::to_string(seed_) + " key mean=" + std::to_string(key_mean_);
    }

    // The column means of the keys, [batch * heads][head_dim], in FP64 rounded to float.
    std::vector<float> key_means() const {
        const int64_t heads = int64_t(shape_.batch) * shape_.heads, D = shape_.head_dim;
        std::vector<float> means(size_t(heads * D));
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t d = 0; d < D; ++d) {
                double sum = 0;
                for (int64_t j = 0; j < shape_.len_kv; ++j) sum += k_[size_t((h * shape_.len_kv + j) * D + d)];
                means[size_t(h * D + d)] = float(sum / double(shape_.len_kv));
            }
        return means;
    }

    void check(const Gradients& gradients) const {
        check_gradient("dq", gradients.dq, q_.size(), dq_ref_);
        check_gradient("dk", gradients.dk, k_.size(), dk_ref_);
        check_gradient("dv", gradients.dv, v_.size(), dv_ref_);
    }

private:
    AttentionShape shape_;
    uint64_t seed_;
    float key_mean_;
    std::vector<float> q_, k_, v_, dout_;
    DeviceBuffer<Element> q_dev_, k_dev_, v_dev_, do_dev_, o_dev_;
    DeviceBuffer<float> lse_dev_;
    std::vector<double> dq_ref_, dk_ref_, dv_ref_;
};

bool same_bits(const std::vector<Element>& a, const std::vector<Element>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(Element)) == 0;
}

bool fits(int len_q, int len_kv) {
    const StageCapabilities& caps = stage_capabilities();
    return len_q <= caps.max_len_q && len_kv <= caps.max_len_kv;
}

}  // namespace

// Declared in test_support.h: one backward pass on fresh random inputs against the reference.
void check_backward(const AttentionShape& shape) {
    const uint64_t seed = fresh_seed();
    INFO(attention_stage_name(), " backward ", shape.to_string(), " seed=", seed);
    const BackwardCase backward(shape, seed);
    backward.check(backward.run());
}

// deterministic = true (declared in test_support.h): `runs` backward passes on the same inputs,
// the first within the tolerance of the FP64 reference, every later one the same bit for bit
// (dQ, dK, dV, with the guard elements after their ends).
void check_deterministic(AttentionShape shape, int runs) {
    shape.deterministic = true;
    const BackwardCase backward(shape);
    INFO(backward.describe());
    const Gradients first = backward.run();
    backward.check(first);
    for (int run = 2; run <= runs; ++run) {
        INFO("run ", run, " of ", runs);
        const Gradients again = backward.run();
        CHECK_MESSAGE(same_bits(again.dq, first.dq), "dq differs from the first run's");
        CHECK_MESSAGE(same_bits(again.dk, first.dk), "dk differs from the first run's");
        CHECK_MESSAGE(same_bits(again.dv, first.dv), "dv differs from the first run's");
    }
}

namespace {

// A stage without a deterministic backward refuses deterministic = true by name, on real
// device buffers, and writes nothing.
void check_deterministic_refused() {
    const StageCapabilities& caps = stage_capabilities();
    AttentionShape shape = make_shape(2, 2, 200, 333, caps.head_dims.front(), caps.causal);
    shape.deterministic = true;
    DeviceBuffer<Element> q(size_t(shape.q_elements())), k(size_t(shape.kv_elements())),
        v(size_t(shape.kv_elements())), o(size_t(shape.q_elements())),
        dout(size_t(shape.q_elements())), dq(size_t(shape.q_elements())),
        dk(size_t(shape.kv_elements())), dv(size_t(shape.kv_elements()));
    DeviceBuffer<float> lse(size_t(shape.lse_elements()));
    dq.poison();
    dk.poison();
    dv.poison();
    try {
        attention_backward(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(),
                           dq.data(), dk.data(), dv.data(), shape);
        FAIL(caps.name, " accepted deterministic = true without deterministic_backward");
    } catch (const std::invalid_argument& error) {
        INFO(error.what());
        CHECK(std::string(error.what()).find("deterministic = true is not allowed") != std::string::npos);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(still_poisoned(dq.download().data(), dq.bytes()));
    CHECK(still_poisoned(dk.download().data(), dk.bytes()));
    CHECK(still_poisoned(dv.download().data(), dv.bytes()));
}

}  // namespace

TEST_CASE("backward workspace: deterministic = true reports its own, at least the default's") {
    const StageCapabilities& caps = stage_capabilities();
    for (int head_dim : caps.head_dims)
        for (auto [len_q, len_kv] : {std::pair{1, 1}, std::pair{200, 333}, std::pair{4096, 4096}}) {
            AttentionShape shape = make_shape(2, 3, len_q, len_kv, head_dim);
            const size_t plain = attention_backward_workspace_bytes(shape);
            shape.deterministic = true;
            INFO(shape.to_string());
            // A stage without the mode refuses the shape in the launcher; what it reports here
            // is then only the default's (it never allocates for it).
            if (caps.deterministic_backward)
                CHECK(attention_backward_workspace_bytes(shape) > plain);
            else
                CHECK(attention_backward_workspace_bytes(shape) == plain);
        }
}

GPU_TEST_CASE("backward: square lengths 1 to 1000, every head dim, causal and not") {
    for_each_variant([&](int head_dim, bool causal) {
        for (int length : edge_lengths())
            if (fits(length, length)) check_backward(make_shape(1, 1, length, length, head_dim, causal));
    });
}

GPU_TEST_CASE("backward: several batch x heads") {
    for_each_variant([&](int head_dim, bool causal) {
        check_backward(make_shape(2, 3, 65, 65, head_dim, causal));
        check_backward(make_shape(3, 5, 127, 127, head_dim, causal));
        check_backward(make_shape(4, 1, 17, 17, head_dim, causal));
    });
}

GPU_TEST_CASE("backward: len_q != len_kv, both ways") {
    for_each_variant([&](int head_dim, bool causal) {
        for (auto [len_q, len_kv] : unequal_lengths())
            if (fits(len_q, len_kv)) check_backward(make_shape(2, 2, len_q, len_kv, head_dim, causal));
    });
}

GPU_TEST_CASE("backward: a long sequence, and a custom scale") {
    const StageCapabilities& caps = stage_capabilities();
    for_each_variant([&](int head_dim, bool causal) {
        const int length = std::min({2051, caps.max_len_q, caps.max_len_kv});
        check_backward(make_shape(1, 2, length, length, head_dim, causal));
        check_backward(make_shape(1, 2, 77, 100, head_dim, causal, 0.3f));
    });
}

// A key_centre given by the caller (capabilities.key_centre_backward): the convert kernel reads it
// as the c of the centred dQ, dQ_i = scale (sum_j dS_ij K_j - rowsum(dS)_i c), instead of the mean
// of the call's keys. A call that sees all of a row's keys gets the true dQ for any c in exact
// arithmetic; the rounding error of delta = rowsum(dO * O) through the bf16 O is multiplied by
// K's part that c leaves (lab notes 11), so c must be near the keys' mean. Here: c = the keys'
// own mean computed on the host (the suite's keys, mean 0.5), and c = 0 with keys of mean 0; both
// against FP64 at the suite's tolerance. The ring (stage 13) passes every call the mean of all
// the sequence's keys, which its own GPU cases check.
void check_key_centre(const AttentionShape& shape) {
    {
        const BackwardCase backward(shape);
        const std::vector<float> means = backward.key_means();
        DeviceBuffer<float> centre(means.size());
        centre.upload(means);
        INFO(backward.describe(), " key_centre = the keys' means");
        backward.check(backward.run(centre.data()));
    }
    {
        const BackwardCase backward(shape, fresh_seed(), /*key_mean=*/0.0f);
        const size_t centre_count = size_t(shape.batch * shape.heads * shape.head_dim);
        DeviceBuffer<float> centre(centre_count);
        centre.upload(std::vector<float>(centre_count, 0.0f));
        INFO(backward.describe(), " key_centre = 0");
        backward.check(backward.run(centre.data()));
    }
}

GPU_TEST_CASE("backward: a given key_centre against FP64 (the keys' own means; 0 for keys of mean 0)") {
    const StageCapabilities& caps = stage_capabilities();
    if (!caps.key_centre_backward) return;  // refused instead: the host cases check that
    for_each_variant([&](int head_dim, bool causal) {
        for (int length : edge_lengths())
            if (fits(length, length)) check_key_centre(make_shape(1, 1, length, length, head_dim, causal));
        for (auto [len_q, len_kv] : unequal_lengths())
            if (fits(len_q, len_kv)) check_key_centre(make_shape(2, 2, len_q, len_kv, head_dim, causal));
        check_key_centre(make_shape(2, 3, 65, 65, head_dim, causal));
        const int length = std::min({2051, caps.max_len_q, caps.max_len_kv});
        check_key_centre(make_shape(1, 2, length, length, head_dim, causal));
        if (caps.deterministic_backward) {
            AttentionShape fixed_order = make_shape(1, 2, length, length, head_dim, causal);
            fixed_order.deterministic = true;
            check_key_centre(fixed_order);
        }
    });
}

// Issue 32: a race in 11's exact-D path (one key tile, kv_tiles == 1, over several query
// tiles), which racecheck found on the shapes of "len_q != len_kv" and the sanitize cases of the
// time (one query tile) never reached. Here: many query tiles, short and full key tiles, the
// same inputs eight times, each result against the reference.
// Where every sum in the workspace (dQ's accumulator, the dS row sums, the K column sums) has
// at most two addends, as in 11 at kv_tiles == 1 (one block, two consumers), the order of the
// adds cannot change a bit (0 + a + b = 0 + b + a), so there the repeats must also agree bit for
// bit. Elsewhere only the tolerance holds: 07 at D = 128 adds four warps' dS row sums by atomics.
GPU_TEST_CASE("backward: one key tile over many query tiles (the exact D), repeated") {
    constexpr int kRepeats = 8;
    const bool deterministic = std::string(attention_stage_name()) == "11_hopper_backward";
    for_each_variant([&](int head_dim, bool causal) {
        for (int len_kv : {17, 100, 128}) {
            if (!fits(1500, len_kv)) continue;
            const BackwardCase backward(make_shape(1, 2, 1500, len_kv, head_dim, causal));
            INFO(backward.describe());
            Gradients first;
            for (int repeat = 0; repeat < kRepeats; ++repeat) {
                INFO("repeat ", repeat + 1, " of ", kRepeats);
                Gradients gradients = backward.run();
                backward.check(gradients);
                if (repeat == 0) {
                    first = std::move(gradients);
                } else if (deterministic) {
                    CHECK_MESSAGE(same_bits(gradients.dq, first.dq), "dq differs from the first run's");
                    CHECK_MESSAGE(same_bits(gradients.dk, first.dk), "dk differs from the first run's");
                    CHECK_MESSAGE(same_bits(gradients.dv, first.dv), "dv differs from the first run's");
                }
            }
        }
    });
}

// deterministic = true over the shape matrix: tile edges, len_q != len_kv both ways, several
// batch x heads, more blocks than an H100 has SMs (2 x 16 heads x 8 key blocks = 256), and a
// long sequence (17 key blocks in each query tile's chain). A stage without the mode must
// refuse it instead.
GPU_TEST_CASE("backward: deterministic = true gives the same bits run to run, within the tolerance") {
    if (!stage_capabilities().deterministic_backward) {
        check_deterministic_refused();
        return;
    }
    constexpr int kRuns = 3;
    for_each_variant([&](int head_dim, bool causal) {
        for (int length : edge_lengths())
            if (fits(length, length)) check_deterministic(make_shape(1, 1, length, length, head_dim, causal), kRuns);
        for (auto [len_q, len_kv] : unequal_lengths())
            if (fits(len_q, len_kv)) check_deterministic(make_shape(2, 2, len_q, len_kv, head_dim, causal), kRuns);
        check_deterministic(make_shape(2, 3, 65, 65, head_dim, causal), kRuns);
        check_deterministic(make_shape(3, 5, 127, 127, head_dim, causal), kRuns);
        if (fits(513, 1000)) check_deterministic(make_shape(2, 16, 513, 1000, head_dim, causal), kRuns);
        const StageCapabilities& caps = stage_capabilities();
        const int length = std::min({2051, caps.max_len_q, caps.max_len_kv});
        check_deterministic(make_shape(1, 2, length, length, head_dim, causal), kRuns);
    });
}

// Run by `make sanitize` under compute-sanitizer (the shapes: test_support.h).
GPU_TEST_CASE("sanitize: backward deterministic") {
    if (!stage_capabilities().deterministic_backward) {
        check_deterministic_refused();
        return;
    }
    for_each_variant([&](int head_dim, bool causal) {
        for (const AttentionShape& shape : sanitize_tile_shapes(head_dim, causal))
            if (fits(shape.len_q, shape.len_kv)) check_deterministic(shape, 2);
    });
}

GPU_TEST_CASE("sanitize: backward edge shapes") {
    for_each_variant([&](int head_dim, bool causal) {
        for (const AttentionShape& shape : sanitize_shapes(head_dim, causal)) check_backward(shape);
    });
}

GPU_TEST_CASE("sanitize: backward tiles") {
    for_each_variant([&](int head_dim, bool causal) {
        for (const AttentionShape& shape : sanitize_tile_shapes(head_dim, causal))
            if (fits(shape.len_q, shape.len_kv)) check_backward(shape);
    });
}

GPU_TEST_CASE("sanitize: backward exact D") {
    for_each_variant([&](int head_dim, bool causal) {
        for (const AttentionShape& shape : sanitize_exact_d_shapes(head_dim, causal))
            if (fits(shape.len_q, shape.len_kv)) check_backward(shape);
    });
}

GPU_TEST_CASE("backward: invalid input throws and leaves dq, dk, dv untouched") {
    const StageCapabilities& caps = stage_capabilities();
    const AttentionShape good = make_shape(1, 2, 33, 40, caps.head_dims.front());
    DeviceBuffer<Element> q(size_t(good.q_elements())), k(size_t(good.kv_elements())),
        v(size_t(good.kv_elements())), o(size_t(good.q_elements())),
        dout(size_t(good.q_elements()));
    DeviceBuffer<float> lse(size_t(good.lse_elements()));
    DeviceBuffer<Element> dq(size_t(good.q_elements())), dk(size_t(good.kv_elements())),
        dv(size_t(good.kv_elements()));
    dq.poison();
    dk.poison();
    dv.poison();
    AttentionShape bad = good;
    bad.len_q = 0;
    CHECK_THROWS_AS(attention_backward(q.data(), k.data(), v.data(), o.data(), lse.data(),
                                       dout.data(), dq.data(), dk.data(), dv.data(), bad),
                    std::invalid_argument);
    bad = good;
    bad.head_dim = 80;
    CHECK_THROWS_AS(attention_backward(q.data(), k.data(), v.data(), o.data(), lse.data(),
                                       dout.data(), dq.data(), dk.data(), dv.data(), bad),
                    std::invalid_argument);
    CHECK_THROWS_AS(attention_backward(q.data(), k.data(), v.data(), o.data(), lse.data(),
                                       nullptr, dq.data(), dk.data(), dv.data(), good),
                    std::invalid_argument);
    CHECK_THROWS_AS(attention_backward(q.data(), k.data(), v.data(), o.data(), nullptr,
                                       dout.data(), dq.data(), dk.data(), dv.data(), good),
                    std::invalid_argument);
    // Misaligned by one element: below the stage's vector width.
    CHECK_THROWS_AS(attention_backward(q.data(), k.data(), v.data(), o.data(), lse.data(),
                                       dout.data(), dq.data() + 1, dk.data(), dv.data(), good),
                    std::invalid_argument);
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(still_poisoned(dq.download().data(), dq.bytes()));
    CHECK(still_poisoned(dk.download().data(), dk.bytes()));
    CHECK(still_poisoned(dv.download().data(), dv.bytes()));
}

// The contract: every scale that validation accepts gives finite gradients (see the forward's
// case of the same name for why finiteness, not the reference, is the check).
GPU_TEST_CASE("backward: the largest accepted scale gives finite gradients") {
    for_each_variant([](int head_dim, bool causal) {
        const AttentionShape shape = make_shape(1, 2, 130, 77, head_dim, causal, kMaxScale);
        const uint64_t seed = fresh_seed();
        INFO(shape.to_string(), " seed=", seed);
        const size_t q_count = size_t(shape.q_elements()), kv_count = size_t(shape.kv_elements());
        DeviceBuffer<Element> q(q_count), k(kv_count), v(kv_count), o(q_count), dout(q_count),
            dq(q_count), dk(kv_count), dv(kv_count);
        DeviceBuffer<float> lse(size_t(shape.lse_elements()));
        q.upload(from_float<Element>(stage_inputs(q_count, seed)));
        k.upload(from_float<Element>(stage_inputs(kv_count, seed + 1)));
        v.upload(from_float<Element>(stage_inputs(kv_count, seed + 2)));
        dout.upload(from_float<Element>(stage_inputs(q_count, seed + 3)));
        attention_forward(q.data(), k.data(), v.data(), o.data(), lse.data(), shape);
        dq.poison();
        dk.poison();
        dv.poison();
        attention_backward(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(),
                           dq.data(), dk.data(), dv.data(), shape);
        CUDA_CHECK(cudaDeviceSynchronize());
        for (const auto* buffer : {&dq, &dk, &dv}) {
            const std::vector<float> values = to_float(buffer->download());
            CHECK(std::all_of(values.begin(), values.end(), [](float x) { return std::isfinite(x); }));
        }
    });
}

#endif  // ATTENTION_HAS_BACKWARD
