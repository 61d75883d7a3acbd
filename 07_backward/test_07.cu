// Cases only stage 07 has: the dQ strategy that attention_backward does not use (the second
// kernel; the shared suite checks the default, atomics) is checked against the FP64 reference
// too, and it must be deterministic, bit for bit.
#include <cstring>
#include <vector>

#include "reference.h"
#include "test_support.h"

enum class DqStrategy { atomic, second_kernel };
void attention_backward_with(DqStrategy strategy, const __nv_bfloat16* q, const __nv_bfloat16* k,
                             const __nv_bfloat16* v, const __nv_bfloat16* o, const float* lse,
                             const __nv_bfloat16* dout, __nv_bfloat16* dq, __nv_bfloat16* dk,
                             __nv_bfloat16* dv, const AttentionShape& shape, cudaStream_t stream);

namespace {

struct Problem {
    AttentionShape shape;
    uint64_t seed;
    std::vector<float> q, k, v, dout;
    DeviceBuffer<__nv_bfloat16> q_dev, k_dev, v_dev, o_dev, do_dev, dq_dev, dk_dev, dv_dev;
    DeviceBuffer<float> lse_dev;

    explicit Problem(const AttentionShape& s) : shape(s), seed(fresh_seed()) {
        q = stage_inputs(size_t(shape.q_elements()), seed);
        k = stage_inputs(size_t(shape.kv_elements()), seed + 1);
        v = stage_inputs(size_t(shape.kv_elements()), seed + 2);
        dout = stage_inputs(q.size(), seed + 3);
        q_dev = DeviceBuffer<__nv_bfloat16>(q.size());
        k_dev = DeviceBuffer<__nv_bfloat16>(k.size());
        v_dev = DeviceBuffer<__nv_bfloat16>(v.size());
        do_dev = DeviceBuffer<__nv_bfloat16>(q.size());
        o_dev = DeviceBuffer<__nv_bfloat16>(q.size());
        dq_dev = DeviceBuffer<__nv_bfloat16>(q.size());
        dk_dev = DeviceBuffer<__nv_bfloat16>(k.size());
        dv_dev = DeviceBuffer<__nv_bfloat16>(v.size());
        lse_dev = DeviceBuffer<float>(size_t(shape.lse_elements()));
        q_dev.upload(from_float<__nv_bfloat16>(q));
        k_dev.upload(from_float<__nv_bfloat16>(k));
        v_dev.upload(from_float<__nv_bfloat16>(v));
        do_dev.upload(from_float<__nv_bfloat16>(dout));
        attention_forward(q_dev.data(), k_dev.data(), v_dev.data(), o_dev.data(), lse_dev.data(),
                          shape);
    }
    void backward(DqStrategy strategy) {
        dq_dev.poison();
        dk_dev.poison();
        dv_dev.poison();
        attention_backward_with(strategy, q_dev.data(), k_dev.data(), v_dev.data(), o_dev.data(),
                                lse_dev.data(), do_dev.data(), dq_dev.data(), dk_dev.data(),
                                dv_dev.data(), shape, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
    }
};

}  // namespace

GPU_TEST_CASE("07: the second-kernel dQ strategy matches the FP64 reference too") {
    const std::vector<AttentionShape> shapes{
        make_shape(1, 1, 2, 2, 64, true),      make_shape(2, 2, 65, 130, 128),
        make_shape(1, 2, 333, 200, 64, true),  make_shape(1, 2, 200, 333, 128, true),
        make_shape(1, 2, 1030, 1030, 64),      make_shape(1, 1, 2051, 2051, 128)};
    for (const AttentionShape& shape : shapes) {
        Problem problem(shape);
        INFO("second-kernel dQ ", shape.to_string(), " seed=", problem.seed);
        problem.backward(DqStrategy::second_kernel);
        std::vector<double> dq(problem.q.size()), dk(problem.k.size()), dv(problem.v.size());
        reference_backward(shape, problem.q.data(), problem.k.data(), problem.v.data(),
                           problem.dout.data(), dq.data(), dk.data(), dv.data());
        const ErrorStats dq_error = compare(to_float(problem.dq_dev.download()), dq);
        const ErrorStats dk_error = compare(to_float(problem.dk_dev.download()), dk);
        const ErrorStats dv_error = compare(to_float(problem.dv_dev.download()), dv);
        INFO("dq: ", dq_error.to_string(), "; dk: ", dk_error.to_string(), "; dv: ",
             dv_error.to_string());
        CHECK(dq_error.non_finite + dk_error.non_finite + dv_error.non_finite == 0);
        CHECK(dq_error.relative_l2 <= tolerance());
        CHECK(dk_error.relative_l2 <= tolerance());
        CHECK(dv_error.relative_l2 <= tolerance());
    }
}

GPU_TEST_CASE("07: the second-kernel strategy is deterministic, bit for bit") {
    for (const AttentionShape& shape :
         {make_shape(2, 3, 1000, 777, 64), make_shape(1, 4, 513, 2049, 128, true)}) {
        Problem problem(shape);
        INFO(shape.to_string(), " seed=", problem.seed);
        problem.backward(DqStrategy::second_kernel);
        const auto dq = problem.dq_dev.download(), dk = problem.dk_dev.download(),
                   dv = problem.dv_dev.download();
        for (int repeat = 0; repeat < 3; ++repeat) {
            problem.backward(DqStrategy::second_kernel);
            CHECK(std::memcmp(problem.dq_dev.download().data(), dq.data(), problem.dq_dev.bytes()) == 0);
            CHECK(std::memcmp(problem.dk_dev.download().data(), dk.data(), problem.dk_dev.bytes()) == 0);
            CHECK(std::memcmp(problem.dv_dev.download().data(), dv.data(), problem.dv_dev.bytes()) == 0);
        }
    }
}
