// Host cases of the shared suite: they run everywhere, CI included.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "c_shape.h"
#include "online_softmax.h"
#include "reference.h"
#include "stage_name.h"
#include "test_support.h"
#include "validate.h"
#include "workspace.h"

// ---- the FP64 reference against closed forms ---------------------------------------------

TEST_CASE("reference: equal scores give the mean of V, and lse = log(len_kv)") {
    const AttentionShape shape = make_shape(1, 2, 5, 7, 4);
    const std::vector<float> q(size_t(shape.q_elements()), 0.0f);  // every score is 0
    const std::vector<float> k = random_inputs(size_t(shape.kv_elements()), 1);
    const std::vector<float> v = random_inputs(size_t(shape.kv_elements()), 2);
    std::vector<double> o(q.size()), lse(size_t(shape.lse_elements()));
    reference_forward(shape, q.data(), k.data(), v.data(), o.data(), lse.data());
    for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 5; ++i) {
            CHECK(lse[size_t(h * 5 + i)] == doctest::Approx(std::log(7.0)).epsilon(1e-12));
            for (int d = 0; d < 4; ++d) {
                double mean = 0;
                for (int j = 0; j < 7; ++j) mean += double(v[size_t((h * 7 + j) * 4 + d)]) / 7.0;
                CHECK(o[size_t((h * 5 + i) * 4 + d)] == doctest::Approx(mean).epsilon(1e-12));
            }
        }
}

TEST_CASE("reference: causal is top-left aligned, also when len_q != len_kv") {
    for (auto [len_q, len_kv] : {std::pair{6, 4}, std::pair{3, 8}}) {
        const AttentionShape shape = make_shape(1, 1, len_q, len_kv, 2, /*causal=*/true);
        const std::vector<float> q(size_t(shape.q_elements()), 0.0f);
        const std::vector<float> k = random_inputs(size_t(shape.kv_elements()), 3);
        const std::vector<float> v = random_inputs(size_t(shape.kv_elements()), 4);
        std::vector<double> o(q.size()), lse(size_t(shape.lse_elements()));
        reference_forward(shape, q.data(), k.data(), v.data(), o.data(), lse.data());
        for (int i = 0; i < len_q; ++i) {
            const int visible = std::min(i + 1, len_kv);  // query i sees keys 0..i
            CHECK(lse[size_t(i)] == doctest::Approx(std::log(double(visible))).epsilon(1e-12));
            double mean = 0;
            for (int j = 0; j < visible; ++j) mean += double(v[size_t(j * 2)]) / visible;
            CHECK(o[size_t(i * 2)] == doctest::Approx(mean).epsilon(1e-9));
        }
    }
}

TEST_CASE("reference: one dominant key gives its value row") {
    const int D = 8, len_kv = 9, dominant = 6;
    const AttentionShape shape = make_shape(1, 1, 1, len_kv, D, false, 1.0f);
    std::vector<float> q(D, 0.0f), k(size_t(len_kv * D), 0.0f);
    q[0] = 1.0f;
    k[size_t(dominant * D)] = 200.0f;  // score 200 against 0 for every other key
    const std::vector<float> v = random_inputs(size_t(len_kv * D), 5);
    std::vector<double> o(D), lse(1);
    reference_forward(shape, q.data(), k.data(), v.data(), o.data(), lse.data());
    for (int d = 0; d < D; ++d)
        CHECK(o[size_t(d)] == doctest::Approx(v[size_t(dominant * D + d)]).epsilon(1e-12));
    CHECK(lse[0] == doctest::Approx(200.0).epsilon(1e-12));
}

TEST_CASE("reference: plain bf16 emulation lands near the FP64 reference") {
    const AttentionShape shape = make_shape(1, 2, 50, 70, 64, true);
    const auto q = rounded_to_bf16(random_inputs(size_t(shape.q_elements()), 6));
    const auto k = rounded_to_bf16(random_inputs(size_t(shape.kv_elements()), 7));
    const auto v = rounded_to_bf16(random_inputs(size_t(shape.kv_elements()), 8));
    std::vector<double> o(q.size()), lse(size_t(shape.lse_elements()));
    std::vector<float> plain(q.size());
    reference_forward(shape, q.data(), k.data(), v.data(), o.data(), lse.data());
    emulated_bf16_forward(shape, q.data(), k.data(), v.data(), plain.data());
    const ErrorStats error = compare(plain, o);
    INFO(error.to_string());
    CHECK(error.non_finite == 0);
    CHECK(error.relative_l2 > 0);      // bf16 rounding must show
    CHECK(error.relative_l2 < 1e-2);
}

// ---- the online softmax -------------------------------------------------------------------

TEST_CASE("online softmax: merging partial states equals the two-pass softmax") {
    std::mt19937_64 generator(fresh_seed());
    std::normal_distribution<double> normal(0.0, 4.0);
    for (int trial = 0; trial < 20; ++trial) {
        std::vector<double> scores(1 + generator() % 300);
        for (double& s : scores) s = normal(generator);
        // Two passes: the max, then the sum of exponentials.
        double max = -INFINITY, sum = 0;
        for (double s : scores) max = std::max(max, s);
        for (double s : scores) sum += std::exp(s - max);
        // One pass over chunks of random size, merging as the chunks arrive.
        SoftmaxState running{-INFINITY, 0.0};
        for (size_t begin = 0; begin < scores.size();) {
            const size_t end = std::min(scores.size(), begin + 1 + generator() % 40);
            SoftmaxState chunk{-INFINITY, 0.0};
            for (size_t j = begin; j < end; ++j) chunk.max = std::max(chunk.max, scores[j]);
            for (size_t j = begin; j < end; ++j) chunk.sum += std::exp(scores[j] - chunk.max);
            running = online_softmax_merge(running, chunk);
            begin = end;
        }
        CHECK(running.max == max);
        CHECK(running.sum == doctest::Approx(sum).epsilon(1e-12));
    }
    // The empty state is the identity of the merge.
    const SoftmaxState empty{-INFINITY, 0.0}, some{1.5, 2.0};
    CHECK(online_softmax_merge(empty, some).sum == doctest::Approx(2.0));
    CHECK(online_softmax_merge(empty, empty).sum == 0.0);
}

// ---- FLOP and byte counts -----------------------------------------------------------------

TEST_CASE("FLOP and byte counts follow the FlashAttention convention") {
    const AttentionShape shape = make_shape(8, 12, 4096, 4096, 64);
    CHECK(forward_flops(shape) == 4.0 * 8 * 12 * 4096.0 * 4096 * 64);
    AttentionShape causal = shape;
    causal.causal = true;
    CHECK(forward_flops(causal) == forward_flops(shape) / 2);
    CHECK(backward_flops(shape) == 2.5 * forward_flops(shape));
    const AttentionShape bf16 = make_shape(1, 8, 4096, 8192, 128);
    CHECK(forward_min_bytes(bf16, 2) ==
          2.0 * (2 * 4096.0 * 8 * 128 + 2 * 8192.0 * 8 * 128) + 4.0 * 8 * 4096);
}

TEST_CASE("attended pairs count the causal mask exactly") {
    for (auto [len_q, len_kv] : {std::pair{5, 5}, std::pair{7, 3}, std::pair{3, 7}}) {
        AttentionShape shape = make_shape(2, 3, len_q, len_kv, 64, true);
        int64_t brute = 0;
        for (int i = 0; i < len_q; ++i)
            for (int j = 0; j < len_kv; ++j) brute += (j <= i);
        CHECK(shape.attended_pairs() == 6 * brute);
        shape.causal = false;
        CHECK(shape.attended_pairs() == 6 * len_q * len_kv);
    }
}

// ---- bf16 rounding and the error metrics --------------------------------------------------

TEST_CASE("bf16 rounding is round-to-nearest-even, as the device converts") {
    CHECK(round_to_bf16(1.0f) == 1.0f);
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa, 1.
    CHECK(round_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 1.0f);
    // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even, 1 + 2^-6.
    CHECK(round_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 1.0f + std::ldexp(1.0f, -6));
    CHECK(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
    CHECK(std::isinf(round_to_bf16(std::numeric_limits<float>::infinity())));
    const std::vector<float> values = random_inputs(10000, fresh_seed());
    for (float x : values) {
        const float r = round_to_bf16(x);
        CHECK(round_to_bf16(r) == r);                              // idempotent
        CHECK(std::fabs(r - x) <= std::ldexp(std::fabs(x), -8));  // half an ulp of 8 bits
        const float device_rule = __bfloat162float(__float2bfloat16_rn(x));
        CHECK(r == device_rule);
    }
}

TEST_CASE("error metrics: relative L2, max abs and the non-finite count") {
    const std::vector<double> ref{3.0, 4.0};
    CHECK(compare(std::vector<float>{3.0f, 4.0f}, ref).relative_l2 == 0.0);
    const ErrorStats off = compare(std::vector<float>{3.0f, 4.5f}, ref);
    CHECK(off.relative_l2 == doctest::Approx(0.1));
    CHECK(off.max_abs == doctest::Approx(0.5));
    const ErrorStats nan = compare(std::vector<float>{NAN, 4.0f}, ref);
    CHECK(nan.non_finite == 1);
    CHECK(compare(std::vector<float>{INFINITY, 4.0f}, ref).non_finite == 1);
}

// ---- the stage's published capabilities and its validation --------------------------------

TEST_CASE("capabilities: the stage publishes a consistent record") {
    const StageCapabilities& caps = stage_capabilities();
    CHECK(caps.name == attention_stage_name());
    CHECK(caps.dtype == kElementName);
    CHECK(caps.max_len_q >= 1);
    CHECK(caps.max_len_kv >= 1);
    CHECK(caps.alignment_bytes >= int(sizeof(Element)));
    for (int required : {64, 128})
        CHECK(std::find(caps.head_dims.begin(), caps.head_dims.end(), required) !=
              caps.head_dims.end());
#ifdef ATTENTION_HAS_BACKWARD
    CHECK(caps.backward);
#else
    CHECK_FALSE(caps.backward);
#endif
    // Only a backward can be deterministic on request (every forward already is).
    if (caps.deterministic_backward) CHECK(caps.backward);
}

namespace {

// Host buffers with the stage's alignment, poisoned: the launcher must throw before it
// reads or writes any of them.
struct PoisonedHostBuffers {
    explicit PoisonedHostBuffers(const AttentionShape& shape)
        : q(size_t(shape.q_elements())), k(size_t(shape.kv_elements())),
          v(size_t(shape.kv_elements())), o(size_t(shape.q_elements())),
          lse(size_t(shape.lse_elements())) {
        std::memset(static_cast<void*>(o.data()), 0xFF, o.size() * sizeof(Element));
        std::memset(lse.data(), 0xFF, lse.size() * sizeof(float));
    }
    bool untouched() const {
        return still_poisoned(o.data(), o.size() * sizeof(Element)) &&
               still_poisoned(lse.data(), lse.size() * sizeof(float));
    }
    std::vector<Element> q, k, v, o;
    std::vector<float> lse;
};

template <class T>
T* misaligned(T* pointer) {
    return reinterpret_cast<T*>(reinterpret_cast<char*>(pointer) + 2);
}

// Calls the stage's launcher and checks the exception names `field` and `value`.
void expect_rejected(const AttentionShape& shape, const std::string& field,
                     const std::string& value, const Element* q, const Element* k,
                     const Element* v, Element* o, float* lse) {
    INFO("field ", field, " value ", value, " shape ", shape.to_string());
    try {
        attention_forward(q, k, v, o, lse, shape);
        FAIL("no exception for ", field, " = ", value);
    } catch (const std::invalid_argument& error) {
        const std::string message = error.what();
        INFO("message: ", message);
        CHECK(message.find(field + " = " + value) != std::string::npos);
        CHECK(message.find("allowed") != std::string::npos);
    }
}

}  // namespace

TEST_CASE("validation: bad shapes are refused with the field, its value and what is allowed") {
    const StageCapabilities& caps = stage_capabilities();
    const AttentionShape good = make_shape(1, 2, 3, 5, caps.head_dims.front());
    PoisonedHostBuffers buffers(good);
    auto rejected = [&](AttentionShape shape, const std::string& field, const std::string& value) {
        expect_rejected(shape, field, value, buffers.q.data(), buffers.k.data(), buffers.v.data(),
                        buffers.o.data(), buffers.lse.data());
        CHECK(buffers.untouched());
    };
    for (int bad : {0, -1}) {
        AttentionShape s = good;
        s.batch = bad;
        rejected(s, "batch", std::to_string(bad));
        s = good, s.heads = bad;
        rejected(s, "heads", std::to_string(bad));
        s = good, s.len_q = bad;
        rejected(s, "len_q", std::to_string(bad));
        s = good, s.len_kv = bad;
        rejected(s, "len_kv", std::to_string(bad));
        s = good, s.head_dim = bad;
        rejected(s, "head_dim", std::to_string(bad));
    }
    AttentionShape s = good;
    s.head_dim = 72;  // not a head dim any stage supports
    rejected(s, "head_dim", "72");
    if (caps.max_len_q < std::numeric_limits<int>::max()) {
        s = good, s.len_q = caps.max_len_q + 1;
        rejected(s, "len_q", std::to_string(caps.max_len_q + 1));
    }
    if (caps.max_len_kv < std::numeric_limits<int>::max()) {
        s = good, s.len_kv = caps.max_len_kv + 1;
        rejected(s, "len_kv", std::to_string(caps.max_len_kv + 1));
    }
    s = good, s.scale = -1.0f;
    rejected(s, "scale", "-1");
}

TEST_CASE("validation: null and misaligned pointers are refused by name") {
    const StageCapabilities& caps = stage_capabilities();
    const AttentionShape shape = make_shape(1, 1, 4, 4, caps.head_dims.front());
    PoisonedHostBuffers b(shape);
    auto check_null = [&](const std::string& field, const Element* q, const Element* k,
                          const Element* v, Element* o) {
        expect_rejected(shape, field, "null", q, k, v, o, b.lse.data());
        CHECK(b.untouched());
    };
    check_null("q", nullptr, b.k.data(), b.v.data(), b.o.data());
    check_null("k", b.q.data(), nullptr, b.v.data(), b.o.data());
    check_null("v", b.q.data(), b.k.data(), nullptr, b.o.data());
    check_null("o", b.q.data(), b.k.data(), b.v.data(), nullptr);

    // Two bytes off is misaligned for every stage's vector width (at least 4 bytes).
    auto check_misaligned = [&](const std::string& field, const Element* q, const Element* k,
                                const Element* v, Element* o) {
        try {
            attention_forward(q, k, v, o, b.lse.data(), shape);
            FAIL("no exception for a misaligned ", field);
        } catch (const std::invalid_argument& error) {
            const std::string message = error.what();
            INFO(message);
            CHECK(message.find(field + " = ") != std::string::npos);
            CHECK(message.find("aligned to " + std::to_string(caps.alignment_bytes)) !=
                  std::string::npos);
        }
        CHECK(b.untouched());
    };
    check_misaligned("q", misaligned(b.q.data()), b.k.data(), b.v.data(), b.o.data());
    check_misaligned("k", b.q.data(), misaligned(b.k.data()), b.v.data(), b.o.data());
    check_misaligned("v", b.q.data(), b.k.data(), misaligned(b.v.data()), b.o.data());
    check_misaligned("o", b.q.data(), b.k.data(), b.v.data(), misaligned(b.o.data()));
    float* lse_misaligned = reinterpret_cast<float*>(reinterpret_cast<char*>(b.lse.data()) + 2);
    expect_rejected(shape, "lse", "", b.q.data(), b.k.data(), b.v.data(), b.o.data(),
                    lse_misaligned);
    CHECK(b.untouched());
}

TEST_CASE("validation: a workspace larger than the free memory is refused") {
    try {
        validate_workspace(size_t(1) << 40, size_t(80) << 30);
        FAIL("not refused");
    } catch (const std::invalid_argument& error) {
        const std::string message = error.what();
        CHECK(message.find("workspace = 1099511627776 bytes") != std::string::npos);
        CHECK(message.find("85899345920 bytes free") != std::string::npos);
    }
    CHECK_NOTHROW(validate_workspace(100, 100));
}

TEST_CASE("workspace: the stage reports what it allocates") {
    const StageCapabilities& caps = stage_capabilities();
    const AttentionShape small = make_shape(1, 1, 64, 64, caps.head_dims.front());
    const AttentionShape large = make_shape(2, 4, 512, 1024, caps.head_dims.front());
    // Workspace never shrinks as the problem grows.
    CHECK(attention_workspace_bytes(large) >= attention_workspace_bytes(small));
}

// ---- contract edges -----------------------------------------------------------------------

TEST_CASE("validation: a scale whose exp2 factor could overflow is refused") {
    const StageCapabilities& caps = stage_capabilities();
    const AttentionShape good = make_shape(1, 1, 4, 4, caps.head_dims.front());
    // The largest accepted scale, folded with log2(e), times a score of 2^110 is still finite.
    static_assert(kMaxScale * 1.4426950408889634f * 0x1p110f < std::numeric_limits<float>::max(),
                  "the folded exp2 factor stays finite");
    AttentionShape s = good;
    s.scale = kMaxScale;
    CHECK_NOTHROW(validate_shape(s, caps));
    for (float bad : {2.0f * kMaxScale, 1e30f, std::numeric_limits<float>::max(),
                      std::numeric_limits<float>::infinity()}) {
        s.scale = bad;
        INFO("scale ", bad);
        try {
            validate_shape(s, caps);
            FAIL("scale accepted");
        } catch (const std::invalid_argument& error) {
            CHECK(std::string(error.what()).find("scale = ") != std::string::npos);
        }
    }
}

TEST_CASE("validation: an output overlapping an input or another output is refused by name") {
    StageCapabilities caps = stage_capabilities();
    caps.backward = true;  // validate_backward's checks, for every stage's element type
    caps.compute_capability = 0;
    const AttentionShape shape = make_shape(1, 2, 64, 32, caps.head_dims.front());
    const size_t element = caps.dtype == "fp32" ? 4 : 2;
    const size_t q_bytes = size_t(shape.q_elements()) * element;
    const size_t kv_bytes = size_t(shape.kv_elements()) * element;
    // Addresses only: the overlap check refuses them before any memory is touched or asked about.
    auto at = [](size_t offset) { return reinterpret_cast<void*>(uintptr_t(1) << 32 | offset); };
    const size_t stride = size_t(1) << 24;  // far apart: nothing overlaps by default
    void *q = at(0), *k = at(stride), *v = at(2 * stride), *o = at(3 * stride),
         *lse = at(4 * stride), *dout = at(5 * stride), *dq = at(6 * stride),
         *dk = at(7 * stride), *dv = at(8 * stride);
    auto refused = [&](auto&& call, const std::string& field, const std::string& other) {
        INFO(field, " overlapping ", other);
        try {
            call();
            FAIL("not refused");
        } catch (const std::invalid_argument& error) {
            const std::string message = error.what();
            INFO(message);
            CHECK(message.find(field + " = a range overlapping " + other) != std::string::npos);
        }
    };
    auto forward = [&](void* out, void* out_lse) {
        return [&, out, out_lse] { validate_forward(shape, caps, q, k, v, out, out_lse); };
    };
    refused(forward(at(q_bytes - 16), lse), "o", "q");    // o's first row inside q's last
    refused(forward(at(stride + kv_bytes - 16), lse), "o", "k");
    refused(forward(o, at(3 * stride + 16)), "lse", "o");  // lse inside o: outputs overlap
    refused(forward(o, at(2 * stride)), "lse", "v");
    auto backward = [&](void* dq_, void* dk_, void* dv_) {
        return [&, dq_, dk_, dv_] {
            validate_backward(shape, caps, q, k, v, o, lse, dout, dq_, dk_, dv_);
        };
    };
    refused(backward(at(5 * stride + 16), dk, dv), "dq", "dout");
    refused(backward(dq, at(stride), dv), "dk", "k");
    refused(backward(dq, dk, at(7 * stride + kv_bytes - 16)), "dv", "dk");
    refused(backward(dq, at(6 * stride + 16), dv), "dk", "dq");
    // Inputs may alias each other (self-attention with one tensor for q, k and v).
    CHECK_NOTHROW(validate_no_overlap({{"o", o, q_bytes}}, {{"q", q, q_bytes}, {"k", q, q_bytes}}));
}

TEST_CASE("validation: a key_centre is refused by a backward without it, before the pointers; "
          "one that has it checks its alignment and its overlap with the outputs") {
    // validate_backward as every stage's launcher calls it, for both answers of the capability.
    // Addresses only, as above: every call is refused before any memory is touched.
    StageCapabilities caps = stage_capabilities();
    caps.backward = true;
    caps.compute_capability = 0;
    const AttentionShape shape = make_shape(1, 2, 64, 32, caps.head_dims.front());
    auto at = [](size_t offset) { return reinterpret_cast<void*>(uintptr_t(1) << 32 | offset); };
    const size_t stride = size_t(1) << 24;
    void *q = at(0), *k = at(stride), *v = at(2 * stride), *o = at(3 * stride),
         *lse = at(4 * stride), *dout = at(5 * stride), *dq = at(6 * stride), *dk = at(7 * stride),
         *dv = at(8 * stride), *centre = at(9 * stride);
    auto message_of = [&](const StageCapabilities& c, void* dq_, void* key_centre) {
        try {
            validate_backward(shape, c, q, k, v, o, lse, dout, dq_, dk, dv, key_centre);
        } catch (const std::invalid_argument& error) {
            return std::string(error.what());
        }
        return std::string("not refused");
    };
    caps.key_centre_backward = false;
    std::string message = message_of(caps, /*dq=*/nullptr, centre);
    INFO(message);
    CHECK(message.find("key_centre = ") != std::string::npos);
    CHECK(message.find("is not allowed") != std::string::npos);
    CHECK(message.find(caps.name) != std::string::npos);
    CHECK(message.find("dq = null") == std::string::npos);  // ahead of the pointers
    // Without one, the same call gets as far as the pointers (the null dq).
    CHECK(message_of(caps, nullptr, nullptr).find("dq = null") != std::string::npos);
    // A stage that has it lets it through to the same point ...
    caps.key_centre_backward = true;
    message = message_of(caps, nullptr, centre);
    CHECK(message.find("dq = null") != std::string::npos);
    // ... checks its alignment (the tensors', as the kernels read it) ...
    message = message_of(caps, dq, at(9 * stride + 2));
    CHECK(message.find("key_centre = ") != std::string::npos);
    CHECK(message.find("aligned to " + std::to_string(caps.alignment_bytes) + " bytes") != std::string::npos);
    // ... and refuses an output that overlaps its batch * heads * head_dim floats.
    message = message_of(caps, dq, at(8 * stride + 16));
    CHECK(message.find("dv = a range overlapping key_centre") != std::string::npos);
}

TEST_CASE("validation: deterministic = true is refused by a backward without it, before the pointers") {
    // validate_backward as every stage's launcher calls it, for both answers of the capability
    // (this stage's own answer is checked through its launcher below). Addresses only: every
    // call here is refused before any memory is touched or asked about.
    StageCapabilities caps = stage_capabilities();
    caps.backward = true;
    caps.compute_capability = 0;
    AttentionShape shape = make_shape(1, 2, 64, 32, caps.head_dims.front());
    shape.deterministic = true;
    CHECK(shape.to_string().find("deterministic") != std::string::npos);
    auto at = [](size_t offset) { return reinterpret_cast<void*>(uintptr_t(1) << 32 | offset); };
    const size_t stride = size_t(1) << 24;
    void *q = at(0), *k = at(stride), *v = at(2 * stride), *o = at(3 * stride),
         *lse = at(4 * stride), *dout = at(5 * stride), *dk = at(7 * stride), *dv = at(8 * stride);
    auto message_of = [&](const StageCapabilities& c, const AttentionShape& s) {
        try {
            validate_backward(s, c, q, k, v, o, lse, dout, /*dq=*/nullptr, dk, dv);
        } catch (const std::invalid_argument& error) {
            return std::string(error.what());
        }
        return std::string("not refused");
    };
    caps.deterministic_backward = false;
    std::string message = message_of(caps, shape);
    INFO(message);
    CHECK(message.find("deterministic = true is not allowed") != std::string::npos);
    CHECK(message.find(caps.name) != std::string::npos);
    // The same shape without the request gets as far as the pointers (the null dq).
    AttentionShape plain = shape;
    plain.deterministic = false;
    message = message_of(caps, plain);
    CHECK(message.find("dq = null") != std::string::npos);
    // A stage that has it lets the request through to the same point.
    caps.deterministic_backward = true;
    message = message_of(caps, shape);
    CHECK(message.find("dq = null") != std::string::npos);
    CHECK(message.find("deterministic") == std::string::npos);
    // The forward takes the request as it is (every forward is deterministic): here too the
    // first refusal is the null pointer.
    caps.deterministic_backward = false;
    try {
        validate_forward(shape, caps, q, k, v, /*o=*/nullptr, lse);
        FAIL("a null o was not refused");
    } catch (const std::invalid_argument& error) {
        CHECK(std::string(error.what()).find("o = null") != std::string::npos);
    }
}

#ifdef ATTENTION_HAS_BACKWARD
TEST_CASE("validation: the stage's own backward refuses deterministic = true unless it has it") {
    // Through the launcher, on poisoned host buffers: nothing may be launched or written. A
    // stage without the mode refuses by name; a stage with it gets past that check and stops
    // at the host memory (with a GPU) or at the missing GPU (without one).
    const StageCapabilities& caps = stage_capabilities();
    AttentionShape shape = make_shape(1, 2, 65, 130, caps.head_dims.front(), caps.causal);
    shape.deterministic = true;
    PoisonedHostBuffers b(shape);
    std::vector<Element> dout(b.o.size()), dq(b.o.size()), dk(b.k.size()), dv(b.v.size());
    std::memset(static_cast<void*>(dq.data()), 0xFF, dq.size() * sizeof(Element));
    std::string message = "not refused";
    try {
        attention_backward(b.q.data(), b.k.data(), b.v.data(), b.o.data(), b.lse.data(),
                           dout.data(), dq.data(), dk.data(), dv.data(), shape);
    } catch (const std::exception& error) {
        message = error.what();
        cudaGetLastError();  // leave no CUDA error to the next case
    }
    INFO(message);
    CHECK(message != "not refused");
    if (caps.deterministic_backward)
        CHECK(message.find("deterministic") == std::string::npos);
    else
        CHECK(message.find("deterministic = true is not allowed") != std::string::npos);
    CHECK(b.untouched());
    CHECK(still_poisoned(dq.data(), dq.size() * sizeof(Element)));
}

TEST_CASE("validation: the stage's own backward refuses a key_centre unless it has it") {
    // Through the launcher, on poisoned host buffers, as above: a stage without it refuses by
    // name; a stage with it gets past that check and stops at the host memory (with a GPU) or at
    // the missing GPU (without one).
    const StageCapabilities& caps = stage_capabilities();
    const AttentionShape shape = make_shape(1, 2, 65, 130, caps.head_dims.front(), caps.causal);
    PoisonedHostBuffers b(shape);
    std::vector<Element> dout(b.o.size()), dq(b.o.size()), dk(b.k.size()), dv(b.v.size());
    std::memset(static_cast<void*>(dq.data()), 0xFF, dq.size() * sizeof(Element));
    std::vector<float> centre(size_t(shape.batch * shape.heads * shape.head_dim), 0.25f);
    std::string message = "not refused";
    try {
        attention_backward(b.q.data(), b.k.data(), b.v.data(), b.o.data(), b.lse.data(),
                           dout.data(), dq.data(), dk.data(), dv.data(), shape, nullptr, centre.data());
    } catch (const std::exception& error) {
        message = error.what();
        cudaGetLastError();  // leave no CUDA error to the next case
    }
    INFO(message);
    CHECK(message != "not refused");
    if (caps.key_centre_backward) {
        CHECK(message.find("key_centre") == std::string::npos);
    } else {
        CHECK(message.find("key_centre = ") != std::string::npos);
        CHECK(message.find("is not allowed") != std::string::npos);
        CHECK(message.find(caps.name) != std::string::npos);
    }
    CHECK(b.untouched());
    CHECK(still_poisoned(dq.data(), dq.size() * sizeof(Element)));
}
#endif

TEST_CASE("validation: host memory is refused by name, and without a GPU the CUDA state stays clean") {
    // The decision, for every kind of memory cudaPointerGetAttributes reports.
    cudaPointerAttributes attributes{};
    attributes.type = cudaMemoryTypeDevice;
    CHECK(device_pointer_problem(attributes) == nullptr);
    attributes.type = cudaMemoryTypeManaged;
    CHECK(device_pointer_problem(attributes) == nullptr);
    attributes.type = cudaMemoryTypeUnregistered;
    CHECK(device_pointer_problem(attributes) != nullptr);
    attributes.type = cudaMemoryTypeHost;
    attributes.devicePointer = nullptr;
    CHECK(device_pointer_problem(attributes) != nullptr);

    // The query itself: with a GPU, plain host memory is refused naming the field; without
    // one, it cannot be told and is let through. Either way it leaves no CUDA error behind
    // that was not there before (without a driver every call reports that one).
    std::vector<float> host(64);
    const cudaError_t before = cudaGetLastError();
    const bool gpu = gpu_unusable_reason(StageCapabilities{}).empty();
    INFO("GPU visible: ", gpu);
    if (gpu) {
        try {
            validate_device_pointer("q", host.data());
            FAIL("host memory accepted");
        } catch (const std::invalid_argument& error) {
            const std::string message = error.what();
            INFO(message);
            CHECK(message.find("q = ") != std::string::npos);
            CHECK(message.find("host memory") != std::string::npos);
        }
    } else {
        CHECK_NOTHROW(validate_device_pointer("q", host.data()));
    }
    CHECK(cudaGetLastError() == before);
}

TEST_CASE("validation: the launcher refuses host buffers naming the field (GPU)" *
          doctest::skip(!stage_gpu_usable())) {
    const StageCapabilities& caps = stage_capabilities();
    const AttentionShape shape = make_shape(1, 1, 4, 4, caps.head_dims.front());
    PoisonedHostBuffers b(shape);
    expect_rejected(shape, "q", "", b.q.data(), b.k.data(), b.v.data(), b.o.data(), b.lse.data());
    CHECK(b.untouched());
}

TEST_CASE("workspace: sizes saturate instead of wrapping around") {
    CHECK(saturating_product({3, 5, 7}) == 105);
    CHECK(saturating_product({size_t(1) << 40, size_t(1) << 30}) == SIZE_MAX);
    CHECK(saturating_product({size_t(1) << 40, 0, size_t(1) << 30}) == 0);
    const StageCapabilities& caps = stage_capabilities();
    const AttentionShape large = make_shape(2, 4, 512, 1024, caps.head_dims.front());
    // batch * heads just inside the grid's limit, the longest lengths the stage accepts.
    const AttentionShape huge =
        make_shape(1 << 20, (1 << 11) - 1, caps.max_len_q, caps.max_len_kv, caps.head_dims.front());
    CHECK(attention_workspace_bytes(huge) >= attention_workspace_bytes(large));
}

// ---- the C ABI (common/attention_c.h), as the suite's shared library exports it -----------

namespace {

std::string c_error() { return attention_c_last_error(); }

// Refused as bad input, with a message holding each of `needles`.
void expect_c_refused(int code, std::initializer_list<std::string> needles) {
    const std::string message = c_error();
    INFO("code ", code, ", message: ", message);
    CHECK(code == ATTENTION_C_INVALID_ARGUMENT);
    for (const std::string& needle : needles) CHECK(message.find(needle) != std::string::npos);
}

}  // namespace

TEST_CASE("C ABI: the capability record is the stage's stage_capabilities()") {
    CHECK(attention_c_abi_version() == ATTENTION_C_ABI_VERSION);
    AttentionCCapabilities record;
    std::memset(&record, 0xAB, sizeof record);
    REQUIRE(attention_c_capabilities(&record) == ATTENTION_C_OK);
    CHECK(c_error() == "");
    const StageCapabilities& caps = stage_capabilities();
    CHECK(std::string(record.name) == caps.name);
    CHECK(std::string(record.name) == attention_stage_name());
    CHECK(std::string(record.dtype) == caps.dtype);
    REQUIRE(record.head_dim_count == int(caps.head_dims.size()));
    for (int i = 0; i < 8; ++i)
        CHECK(record.head_dims[i] == (i < record.head_dim_count ? caps.head_dims[size_t(i)] : 0));
    CHECK(record.max_len_q == caps.max_len_q);
    CHECK(record.max_len_kv == caps.max_len_kv);
    CHECK(record.causal == int(caps.causal));
    CHECK(record.backward == int(caps.backward));
    CHECK(record.alignment_bytes == caps.alignment_bytes);
    CHECK(record.compute_capability == caps.compute_capability);
    CHECK(record.deterministic_backward == int(caps.deterministic_backward));
    CHECK(record.key_centre_backward == int(caps.key_centre_backward));
}

TEST_CASE("C ABI: bad input is ATTENTION_C_INVALID_ARGUMENT, the message naming the field") {
    const StageCapabilities& caps = stage_capabilities();
    const AttentionShape shape = make_shape(1, 1, 4, 4, caps.head_dims.front());
    const AttentionCShape good = to_c_shape(shape);
    PoisonedHostBuffers b(shape);
    auto forward = [&](const void* q, const AttentionCShape* s) {
        return attention_c_forward(q, b.k.data(), b.v.data(), b.o.data(), b.lse.data(), s, nullptr);
    };
    expect_c_refused(forward(nullptr, &good), {"q = null", "allowed"});
    expect_c_refused(forward(b.q.data(), nullptr), {"shape = null"});
    AttentionCShape bad = good;
    bad.head_dim = 72;
    expect_c_refused(forward(b.q.data(), &bad), {"head_dim = 72", caps.name});
    bad = good, bad.len_kv = 0;
    expect_c_refused(forward(b.q.data(), &bad), {"len_kv = 0"});
    bad = good, bad.causal = 2;  // a C int, not a bool: only 0 and 1 mean something
    expect_c_refused(forward(b.q.data(), &bad), {"causal = 2"});
    bad = good, bad.deterministic = 2;  // the same for deterministic
    expect_c_refused(forward(b.q.data(), &bad), {"deterministic = 2", "0 or 1"});
    bad = good, bad.deterministic = -1;
    expect_c_refused(forward(b.q.data(), &bad), {"deterministic = -1"});
    bad = good, bad.scale = -1.0f;
    expect_c_refused(forward(b.q.data(), &bad), {"scale = -1"});
    CHECK(b.untouched());

    size_t bytes = 123;
    bad = good, bad.head_dim = 72;
    expect_c_refused(attention_c_workspace_bytes(&bad, &bytes), {"head_dim = 72"});
    CHECK(bytes == 0);
    expect_c_refused(attention_c_workspace_bytes(nullptr, &bytes), {"shape = null"});
    expect_c_refused(attention_c_workspace_bytes(&good, nullptr), {"bytes = null"});
    expect_c_refused(attention_c_backward_workspace_bytes(&good, nullptr), {"bytes = null"});
    expect_c_refused(attention_c_capabilities(nullptr), {"out = null"});
    bad = good, bad.deterministic = 2;
    expect_c_refused(attention_c_workspace_bytes(&bad, &bytes), {"deterministic = 2"});
    CHECK(bytes == 0);
}

TEST_CASE("C ABI: the forward takes deterministic = 1 as it is (every forward is deterministic)") {
    const StageCapabilities& caps = stage_capabilities();
    AttentionShape shape = make_shape(1, 2, 17, 33, caps.head_dims.front());
    const AttentionCShape plain = to_c_shape(shape);
    shape.deterministic = true;
    const AttentionCShape deterministic = to_c_shape(shape);
    REQUIRE(deterministic.deterministic == 1);
    size_t plain_bytes = 1, bytes = 2;
    REQUIRE(attention_c_workspace_bytes(&plain, &plain_bytes) == ATTENTION_C_OK);
    REQUIRE(attention_c_workspace_bytes(&deterministic, &bytes) == ATTENTION_C_OK);
    CHECK(bytes == plain_bytes);
    // The first refusal is the null q, not the request.
    PoisonedHostBuffers b(shape);
    expect_c_refused(attention_c_forward(nullptr, b.k.data(), b.v.data(), b.o.data(),
                                         b.lse.data(), &deterministic, nullptr),
                     {"q = null"});
    CHECK(c_error().find("deterministic") == std::string::npos);
    CHECK(b.untouched());
}

TEST_CASE("C ABI: a success clears the last error, and each thread has its own") {
    const StageCapabilities& caps = stage_capabilities();
    const AttentionShape shape = make_shape(2, 4, 64, 64, caps.head_dims.front());
    const AttentionCShape c = to_c_shape(shape);
    REQUIRE(attention_c_capabilities(nullptr) == ATTENTION_C_INVALID_ARGUMENT);
    REQUIRE(c_error().find("out = null") != std::string::npos);

    std::string other_before = "unset", other_after = "unset";
    int other_code = -1;
    std::thread([&] {
        other_before = attention_c_last_error();
        AttentionCShape bad = c;
        bad.batch = -3;
        size_t bytes = 0;
        other_code = attention_c_workspace_bytes(&bad, &bytes);
        other_after = attention_c_last_error();
    }).join();
    CHECK(other_before == "");  // this thread's failure is not the other thread's
    CHECK(other_code == ATTENTION_C_INVALID_ARGUMENT);
    CHECK(other_after.find("batch = -3") != std::string::npos);
    CHECK(c_error().find("out = null") != std::string::npos);  // nor the other way round

    size_t bytes = 1;
    REQUIRE(attention_c_workspace_bytes(&c, &bytes) == ATTENTION_C_OK);
    CHECK(c_error() == "");
    CHECK(bytes == attention_workspace_bytes(shape));
}

TEST_CASE("C ABI: the backward pass where the stage has one, a plain refusal where not") {
    const StageCapabilities& caps = stage_capabilities();
    const AttentionShape shape = make_shape(1, 2, 17, 33, caps.head_dims.front(), true);
    const AttentionCShape c = to_c_shape(shape);
    PoisonedHostBuffers b(shape);
    std::vector<Element> dout(b.o.size()), dq(b.q.size()), dk(b.k.size()), dv(b.v.size());
    size_t bytes = 123;
    const int workspace_code = attention_c_backward_workspace_bytes(&c, &bytes);
#ifdef ATTENTION_HAS_BACKWARD
    CHECK(workspace_code == ATTENTION_C_OK);
    CHECK(bytes == attention_backward_workspace_bytes(shape));
    expect_c_refused(attention_c_backward(b.q.data(), b.k.data(), b.v.data(), b.o.data(),
                                          b.lse.data(), dout.data(), nullptr, dk.data(),
                                          dv.data(), nullptr, &c, nullptr),
                     {"dq = null"});
#else
    const std::string no_backward = std::string("attention: ") + caps.name + " has no backward pass";
    expect_c_refused(workspace_code, {no_backward});
    CHECK(bytes == 0);
    expect_c_refused(attention_c_backward(b.q.data(), b.k.data(), b.v.data(), b.o.data(),
                                          b.lse.data(), dout.data(), dq.data(), dk.data(),
                                          dv.data(), nullptr, &c, nullptr),
                     {no_backward});
#endif
    CHECK(b.untouched());
}

TEST_CASE("C ABI: deterministic = 1 in the backward: refused by a stage without the mode, "
          "passed through by one with it") {
    const StageCapabilities& caps = stage_capabilities();
    AttentionShape shape = make_shape(1, 2, 17, 33, caps.head_dims.front(), caps.causal);
    shape.deterministic = true;
    const AttentionCShape c = to_c_shape(shape);
    PoisonedHostBuffers b(shape);
    std::vector<Element> dout(b.o.size()), dk(b.k.size()), dv(b.v.size());
    size_t bytes = 123;
    const int workspace_code = attention_c_backward_workspace_bytes(&c, &bytes);
    const std::string workspace_message = c_error();
    // dq = null: a stage that lets the request through stops there, before any launch.
    const int backward_code = attention_c_backward(b.q.data(), b.k.data(), b.v.data(),
                                                   b.o.data(), b.lse.data(), dout.data(),
                                                   nullptr, dk.data(), dv.data(), nullptr, &c,
                                                   nullptr);
    const std::string backward_message = c_error();
    INFO("workspace: ", workspace_code, " ", workspace_message);
    INFO("backward: ", backward_code, " ", backward_message);
#ifdef ATTENTION_HAS_BACKWARD
    if (caps.deterministic_backward) {
        CHECK(workspace_code == ATTENTION_C_OK);
        CHECK(bytes == attention_backward_workspace_bytes(shape));
        CHECK(backward_code == ATTENTION_C_INVALID_ARGUMENT);
        CHECK(backward_message.find("dq = null") != std::string::npos);
    } else {
        // Refused by name in both calls, ahead of the null dq; no workspace answered.
        CHECK(workspace_code == ATTENTION_C_INVALID_ARGUMENT);
        CHECK(bytes == 0);
        for (const std::string& message : {workspace_message, backward_message}) {
            CHECK(message.find("deterministic = true is not allowed") != std::string::npos);
            CHECK(message.find(caps.name) != std::string::npos);
        }
        CHECK(backward_code == ATTENTION_C_INVALID_ARGUMENT);
    }
#else
    const std::string no_backward = std::string("attention: ") + caps.name + " has no backward pass";
    CHECK(workspace_code == ATTENTION_C_INVALID_ARGUMENT);
    CHECK(bytes == 0);
    CHECK(workspace_message.find(no_backward) != std::string::npos);
    CHECK(backward_code == ATTENTION_C_INVALID_ARGUMENT);
    CHECK(backward_message.find(no_backward) != std::string::npos);
#endif
    CHECK(b.untouched());
}

TEST_CASE("C ABI: a key_centre in the backward: refused by a stage without it, passed through by "
          "one with it") {
    const StageCapabilities& caps = stage_capabilities();
    const AttentionShape shape = make_shape(1, 2, 17, 33, caps.head_dims.front(), caps.causal);
    const AttentionCShape c = to_c_shape(shape);
    PoisonedHostBuffers b(shape);
    std::vector<Element> dout(b.o.size()), dk(b.k.size()), dv(b.v.size());
    std::vector<float> centre(size_t(shape.batch * shape.heads * shape.head_dim), 0.25f);
    // dq = null: a stage that lets the key_centre through stops there, before any launch.
    const int code = attention_c_backward(b.q.data(), b.k.data(), b.v.data(), b.o.data(),
                                          b.lse.data(), dout.data(), nullptr, dk.data(), dv.data(),
                                          centre.data(), &c, nullptr);
    const std::string message = c_error();
    INFO("backward: ", code, " ", message);
    CHECK(code == ATTENTION_C_INVALID_ARGUMENT);
#ifdef ATTENTION_HAS_BACKWARD
    if (caps.key_centre_backward) {
        CHECK(message.find("dq = null") != std::string::npos);
    } else {
        CHECK(message.find("key_centre = ") != std::string::npos);
        CHECK(message.find("is not allowed") != std::string::npos);
        CHECK(message.find(caps.name) != std::string::npos);
    }
#else
    CHECK(message.find(std::string("attention: ") + caps.name + " has no backward pass") != std::string::npos);
#endif
    // The workspace does not depend on it (the query takes no pointers).
    CHECK(b.untouched());
}

TEST_CASE("C ABI: a launch that fails past validation: no GPU gives ATTENTION_C_RUNTIME_ERROR, "
          "host memory on a GPU ATTENTION_C_INVALID_ARGUMENT") {
    const StageCapabilities& caps = stage_capabilities();
    const AttentionShape shape = make_shape(1, 1, 4, 4, caps.head_dims.front());
    const AttentionCShape c = to_c_shape(shape);
    PoisonedHostBuffers b(shape);
    const int code = attention_c_forward(b.q.data(), b.k.data(), b.v.data(), b.o.data(),
                                         b.lse.data(), &c, nullptr);
    const std::string message = c_error();
    INFO("GPU visible: ", gpu_available(), ", code ", code, ", message: ", message);
    if (gpu_available()) {
        // Valid as far as the host can tell; the device's answer refuses the host memory.
        CHECK(code == ATTENTION_C_INVALID_ARGUMENT);
        CHECK(message.find("q = ") != std::string::npos);
        CHECK(message.find("host memory") != std::string::npos);
    } else {
        // Nothing can tell host from device memory without a GPU: the CUDA call (or, for a
        // Hopper stage, the GPU check) fails, as a runtime error with its message.
        CHECK(code == ATTENTION_C_RUNTIME_ERROR);
        CHECK_FALSE(message.empty());
        cudaGetLastError();  // leave no CUDA error to the next case
    }
    CHECK(b.untouched());
}

TEST_CASE("C ABI: the forward, and the backward, through the C ABI equal the C++ launcher's (GPU)" *
          doctest::skip(!stage_gpu_usable())) {
    const StageCapabilities& caps = stage_capabilities();
    const AttentionShape shape = make_shape(2, 3, 65, 130, caps.head_dims.back(), caps.causal);
    const AttentionCShape c = to_c_shape(shape);
    const uint64_t seed = fresh_seed();
    INFO("seed ", seed, " shape ", shape.to_string());
    auto device = [](size_t count, uint64_t s) {
        DeviceBuffer<Element> buffer(count);
        buffer.upload(from_float<Element>(stage_inputs(count, s)));
        return buffer;
    };
    const size_t q_count = size_t(shape.q_elements()), kv_count = size_t(shape.kv_elements());
    const DeviceBuffer<Element> q = device(q_count, seed), k = device(kv_count, seed + 1),
                                v = device(kv_count, seed + 2);
    DeviceBuffer<Element> o_cpp(q_count), o_c(q_count);
    DeviceBuffer<float> lse_cpp(size_t(shape.lse_elements())), lse_c(size_t(shape.lse_elements()));
    o_c.poison(), lse_c.poison();
    cudaStream_t stream = nullptr;
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
    attention_forward(q.data(), k.data(), v.data(), o_cpp.data(), lse_cpp.data(), shape, stream);
    const int code =
        attention_c_forward(q.data(), k.data(), v.data(), o_c.data(), lse_c.data(), &c, stream);
    INFO("message: ", c_error());
    REQUIRE(code == ATTENTION_C_OK);
    CHECK(c_error() == "");
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    // The forward is deterministic: the same kernels on the same inputs, bit for bit.
    const std::vector<Element> o_expected = o_cpp.download(), o_got = o_c.download();
    CHECK(std::memcmp(o_expected.data(), o_got.data(), o_got.size() * sizeof(Element)) == 0);
    const std::vector<float> lse_expected = lse_cpp.download(), lse_got = lse_c.download();
    CHECK(std::memcmp(lse_expected.data(), lse_got.data(), lse_got.size() * sizeof(float)) == 0);
#ifdef ATTENTION_HAS_BACKWARD
    const DeviceBuffer<Element> dout = device(q_count, seed + 3);
    DeviceBuffer<Element> dq_cpp(q_count), dk_cpp(kv_count), dv_cpp(kv_count);
    DeviceBuffer<Element> dq_c(q_count), dk_c(kv_count), dv_c(kv_count);
    dq_c.poison(), dk_c.poison(), dv_c.poison();
    attention_backward(q.data(), k.data(), v.data(), o_cpp.data(), lse_cpp.data(), dout.data(),
                       dq_cpp.data(), dk_cpp.data(), dv_cpp.data(), shape, stream);
    REQUIRE(attention_c_backward(q.data(), k.data(), v.data(), o_cpp.data(), lse_cpp.data(),
                                 dout.data(), dq_c.data(), dk_c.data(), dv_c.data(), nullptr, &c,
                                 stream) == ATTENTION_C_OK);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    // dQ is summed by atomics (07) or the copy engine's reduce-add (11), in no fixed order:
    // equal up to the order of FP32 additions, then one bf16 rounding.
    for (auto [expected, got] : {std::pair{&dq_cpp, &dq_c}, {&dk_cpp, &dk_c}, {&dv_cpp, &dv_c}}) {
        const std::vector<float> e = to_float(expected->download()), g = to_float(got->download());
        const ErrorStats error = compare(g, std::vector<double>(e.begin(), e.end()));
        INFO(error.to_string());
        CHECK(error.non_finite == 0);
        CHECK(error.relative_l2 < 1e-2);
    }
    if (caps.deterministic_backward) {
        // deterministic = 1 through the C ABI and deterministic = true through the C++
        // launcher: the same sums in the same order, so the same bits.
        AttentionShape fixed_order = shape;
        fixed_order.deterministic = true;
        const AttentionCShape c_fixed_order = to_c_shape(fixed_order);
        dq_c.poison(), dk_c.poison(), dv_c.poison();
        attention_backward(q.data(), k.data(), v.data(), o_cpp.data(), lse_cpp.data(),
                           dout.data(), dq_cpp.data(), dk_cpp.data(), dv_cpp.data(), fixed_order,
                           stream);
        REQUIRE(attention_c_backward(q.data(), k.data(), v.data(), o_cpp.data(), lse_cpp.data(),
                                     dout.data(), dq_c.data(), dk_c.data(), dv_c.data(),
                                     nullptr, &c_fixed_order, stream) == ATTENTION_C_OK);
        REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
        for (auto [expected, got] : {std::pair{&dq_cpp, &dq_c}, {&dk_cpp, &dk_c}, {&dv_cpp, &dv_c}}) {
            const std::vector<Element> e = expected->download(), g = got->download();
            CHECK(std::memcmp(e.data(), g.data(), g.size() * sizeof(Element)) == 0);
        }
    }
    if (caps.key_centre_backward) {
        // A key_centre through the C ABI and through the C++ launcher, in the deterministic mode
        // where the stage has it: the same bits; dK and dV do not depend on it.
        AttentionShape centred = shape;
        centred.deterministic = caps.deterministic_backward;
        const AttentionCShape c_centred = to_c_shape(centred);
        const size_t centre_count = size_t(shape.batch * shape.heads * shape.head_dim);
        DeviceBuffer<float> centre(centre_count);
        centre.upload(random_inputs(centre_count, seed + 7));
        dq_c.poison(), dk_c.poison(), dv_c.poison();
        attention_backward(q.data(), k.data(), v.data(), o_cpp.data(), lse_cpp.data(), dout.data(),
                           dq_cpp.data(), dk_cpp.data(), dv_cpp.data(), centred, stream, centre.data());
        REQUIRE(attention_c_backward(q.data(), k.data(), v.data(), o_cpp.data(), lse_cpp.data(),
                                     dout.data(), dq_c.data(), dk_c.data(), dv_c.data(),
                                     centre.data(), &c_centred, stream) == ATTENTION_C_OK);
        REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
        for (auto [expected, got] : {std::pair{&dq_cpp, &dq_c}, {&dk_cpp, &dk_c}, {&dv_cpp, &dv_c}}) {
            if (caps.deterministic_backward) {
                const std::vector<Element> e = expected->download(), g = got->download();
                CHECK(std::memcmp(e.data(), g.data(), g.size() * sizeof(Element)) == 0);
            } else {
                const std::vector<float> e = to_float(expected->download()), g = to_float(got->download());
                const ErrorStats error = compare(g, std::vector<double>(e.begin(), e.end()));
                INFO("key_centre: ", error.to_string());
                CHECK(error.non_finite == 0);
                CHECK(error.relative_l2 < 1e-2);
            }
        }
    }
#endif
    cudaStreamDestroy(stream);
}
