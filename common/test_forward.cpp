// GPU cases of the shared suite: the stage's forward against the FP64 reference over the
// shape matrix of DESIGN.md, on fresh random inputs, with NaN-poisoned outputs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "reference.h"
#include "stage_name.h"
#include "test_support.h"
#include "validate.h"

void check_forward(const AttentionShape& shape, bool with_lse) {
    const uint64_t seed = fresh_seed();
    INFO(attention_stage_name(), " ", shape.to_string(), " lse=", with_lse, " seed=", seed);
    const std::vector<float> q = stage_inputs(size_t(shape.q_elements()), seed);
    const std::vector<float> k = stage_inputs(size_t(shape.kv_elements()), seed + 1);
    const std::vector<float> v = stage_inputs(size_t(shape.kv_elements()), seed + 2);

    DeviceBuffer<Element> q_dev(q.size()), k_dev(k.size()), v_dev(v.size());
    q_dev.upload(from_float<Element>(q));
    k_dev.upload(from_float<Element>(k));
    v_dev.upload(from_float<Element>(v));
    DeviceBuffer<Element> o_dev(q.size() + kGuard);
    DeviceBuffer<float> lse_dev(size_t(shape.lse_elements()) + kGuard);
    o_dev.poison();
    lse_dev.poison();

    attention_forward(q_dev.data(), k_dev.data(), v_dev.data(), o_dev.data(),
                      with_lse ? lse_dev.data() : nullptr, shape);
    CUDA_CHECK(cudaDeviceSynchronize());

    std::vector<Element> o_raw = o_dev.download();
    std::vector<float> lse_raw = lse_dev.download();
    CHECK_MESSAGE(still_poisoned(o_raw.data() + q.size(), kGuard * sizeof(Element)),
                  "o was written past its end");
    CHECK_MESSAGE(still_poisoned(lse_raw.data() + shape.lse_elements(), kGuard * sizeof(float)),
                  "lse was written past its end");
    o_raw.resize(q.size());
    lse_raw.resize(size_t(shape.lse_elements()));

    std::vector<double> o_ref(q.size()), lse_ref(lse_raw.size());
    reference_forward(shape, q.data(), k.data(), v.data(), o_ref.data(), lse_ref.data());

    const ErrorStats o_error = compare(to_float(o_raw), o_ref);
    INFO("o: ", o_error.to_string());
    CHECK(o_error.non_finite == 0);
    CHECK(o_error.relative_l2 <= tolerance());
    if (sizeof(Element) == 2) {
        // No worse than twice what a plain bf16 implementation gets on the same inputs.
        std::vector<float> o_plain(q.size());
        emulated_bf16_forward(shape, q.data(), k.data(), v.data(), o_plain.data());
        const ErrorStats plain = compare(o_plain, o_ref);
        INFO("plain bf16: ", plain.to_string());
        CHECK(o_error.relative_l2 <= 2 * plain.relative_l2 + 1e-6);
    }
    if (with_lse) {
        const ErrorStats lse_error = compare(lse_raw, lse_ref);
        INFO("lse: ", lse_error.to_string());
        CHECK(lse_error.non_finite == 0);
        // LSE is computed in FP32 by every stage. With a single visible key the LSE is that
        // one score, which can sit near zero: there an absolute 1e-5 is the meaningful bound.
        CHECK((lse_error.relative_l2 <= 1e-5 || lse_error.max_abs <= 1e-5));
    } else {
        CHECK_MESSAGE(still_poisoned(lse_raw.data(), lse_raw.size() * sizeof(float)),
                      "lse was written although it was null");
    }
}

namespace {

int capped(int length, int limit) { return std::min(length, limit); }

}  // namespace

GPU_TEST_CASE("forward: square lengths 1 to 1000, every head dim, causal and not") {
    const StageCapabilities& caps = stage_capabilities();
    for_each_variant([&](int head_dim, bool causal) {
        for (int length : edge_lengths())
            if (length <= caps.max_len_q && length <= caps.max_len_kv)
                check_forward(make_shape(1, 1, length, length, head_dim, causal));
    });
}

GPU_TEST_CASE("forward: several batch x heads") {
    for_each_variant([&](int head_dim, bool causal) {
        check_forward(make_shape(2, 3, 65, 65, head_dim, causal));
        check_forward(make_shape(3, 5, 127, 127, head_dim, causal));
        check_forward(make_shape(4, 1, 17, 17, head_dim, causal));
    });
}

GPU_TEST_CASE("forward: len_q != len_kv, both ways") {
    for_each_variant([&](int head_dim, bool causal) {
        for (auto [len_q, len_kv] : unequal_lengths())
            check_forward(make_shape(2, 2, len_q, len_kv, head_dim, causal));
    });
}

GPU_TEST_CASE("forward: a long sequence") {
    const StageCapabilities& caps = stage_capabilities();
    for_each_variant([&](int head_dim, bool causal) {
        const int length = capped(4099, std::min(caps.max_len_q, caps.max_len_kv));
        check_forward(make_shape(1, 2, length, length, head_dim, causal));
    });
}

GPU_TEST_CASE("forward: lse may be null; a custom scale") {
    for_each_variant([&](int head_dim, bool causal) {
        check_forward(make_shape(1, 2, 100, 77, head_dim, causal), /*with_lse=*/false);
        check_forward(make_shape(1, 2, 77, 100, head_dim, causal, 0.3f));
    });
}

// Run by `make sanitize` under compute-sanitizer (the shapes: test_support.h).
GPU_TEST_CASE("sanitize: edge shapes") {
    for_each_variant([&](int head_dim, bool causal) {
        for (const AttentionShape& shape : sanitize_shapes(head_dim, causal)) check_forward(shape);
    });
}

GPU_TEST_CASE("sanitize: forward tiles") {
    for_each_variant([&](int head_dim, bool causal) {
        for (const AttentionShape& shape : sanitize_tile_shapes(head_dim, causal)) check_forward(shape);
        // lse null (its store is skipped), over at least two query tiles and two key tiles.
        check_forward(make_shape(1, 1, 200, 177, head_dim, causal), /*with_lse=*/false);
    });
}

GPU_TEST_CASE("forward: invalid input throws and leaves device outputs untouched") {
    const StageCapabilities& caps = stage_capabilities();
    const AttentionShape good = make_shape(1, 2, 33, 33, caps.head_dims.front());
    DeviceBuffer<Element> q(size_t(good.q_elements())), k(size_t(good.kv_elements())),
        v(size_t(good.kv_elements())), o(size_t(good.q_elements()));
    DeviceBuffer<float> lse(size_t(good.lse_elements()));
    o.poison();
    lse.poison();
    AttentionShape bad = good;
    bad.len_kv = 0;
    CHECK_THROWS_AS(attention_forward(q.data(), k.data(), v.data(), o.data(), lse.data(), bad),
                    std::invalid_argument);
    CHECK_THROWS_AS(attention_forward(q.data(), k.data(), nullptr, o.data(), lse.data(), good),
                    std::invalid_argument);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<Element> o_after = o.download();
    const std::vector<float> lse_after = lse.download();
    CHECK(still_poisoned(o_after.data(), o.bytes()));
    CHECK(still_poisoned(lse_after.data(), lse.bytes()));
}

GPU_TEST_CASE("forward: a workspace larger than the device is refused before any launch") {
    const StageCapabilities& caps = stage_capabilities();
    // The largest lengths the stage accepts, over many heads: for a stage with an N x N
    // workspace this cannot fit; stages with no workspace must not report one.
    AttentionShape huge = make_shape(64, 64, std::min(caps.max_len_q, 1 << 16),
                                     std::min(caps.max_len_kv, 1 << 16), caps.head_dims.front());
    const size_t workspace = attention_workspace_bytes(huge);
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (workspace == 0) {
        MESSAGE(caps.name, " allocates no workspace: nothing to refuse");
        return;
    }
    // A workspace that does not grow with the lengths (a few bytes: stage 12's tile counter) fits
    // at every shape: nothing to refuse either. One that grows must outgrow the device here.
    if (workspace <= 4096) {
        MESSAGE(caps.name, " allocates ", workspace, " bytes at the largest shape: nothing to refuse");
        return;
    }
    REQUIRE_MESSAGE(workspace > total_bytes, "the shape meant to overflow the device fits");
    // Tiny real buffers: the launcher must refuse on the workspace before reading them.
    DeviceBuffer<Element> q(64), k(64), v(64), o(64);
    DeviceBuffer<float> lse(64);
    o.poison();
    try {
        attention_forward(q.data(), k.data(), v.data(), o.data(), lse.data(), huge);
        FAIL("a workspace of ", workspace, " bytes was not refused");
    } catch (const std::invalid_argument& error) {
        CHECK(std::string(error.what()).find("workspace") != std::string::npos);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<Element> o_after = o.download();
    CHECK(still_poisoned(o_after.data(), o.bytes()));
}

// The contract: every scale that validation accepts gives finite outputs. At the largest one
// the softmax is all but one-hot, so the FP64 reference is not a fair yardstick (near-ties
// flip with rounding); finiteness is the claim.
GPU_TEST_CASE("forward: the largest accepted scale gives a finite result") {
    for_each_variant([](int head_dim, bool causal) {
        const AttentionShape shape = make_shape(1, 2, 130, 77, head_dim, causal, kMaxScale);
        const uint64_t seed = fresh_seed();
        INFO(shape.to_string(), " seed=", seed);
        const size_t q_count = size_t(shape.q_elements()), kv_count = size_t(shape.kv_elements());
        DeviceBuffer<Element> q(q_count), k(kv_count), v(kv_count), o(q_count);
        DeviceBuffer<float> lse(size_t(shape.lse_elements()));
        q.upload(from_float<Element>(stage_inputs(q_count, seed)));
        k.upload(from_float<Element>(stage_inputs(kv_count, seed + 1)));
        v.upload(from_float<Element>(stage_inputs(kv_count, seed + 2)));
        o.poison();
        lse.poison();
        attention_forward(q.data(), k.data(), v.data(), o.data(), lse.data(), shape);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> o_host = to_float(o.download());
        const std::vector<float> lse_host = lse.download();
        CHECK(std::all_of(o_host.begin(), o_host.end(), [](float x) { return std::isfinite(x); }));
        CHECK(std::all_of(lse_host.begin(), lse_host.end(), [](float x) { return std::isfinite(x); }));
    });
}
