// The measurement behind chapter 07's choice of dQ strategy: both strategies timed on the same
// inputs (CUDA events, median of repeated calls), and whether each one's dQ, dK, dV are
// bitwise the same from one call to the next. Not part of the test suite (tests never time).
//
//   make -C 07_backward all && nvcc -std=c++17 -O3 -arch=native -Icommon \
//     07_backward/time_dq_strategies.cu build/07_backward/obj/{attention,harness,validate,\
//     cuda_check,workspace,reference,reference_backward}.o -lcublas -o build/07_backward/time_dq
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "attention.h"
#include "cuda_check.h"
#include "harness.h"

enum class DqStrategy { atomic, second_kernel };
void attention_backward_with(DqStrategy strategy, const __nv_bfloat16* q, const __nv_bfloat16* k,
                             const __nv_bfloat16* v, const __nv_bfloat16* o, const float* lse,
                             const __nv_bfloat16* dout, __nv_bfloat16* dq, __nv_bfloat16* dk,
                             __nv_bfloat16* dv, const AttentionShape& shape, cudaStream_t stream);

namespace {

struct Buffers {
    DeviceBuffer<__nv_bfloat16> q, k, v, o, dout, dq, dk, dv;
    DeviceBuffer<float> lse;
};

// Median time of one call. queued: the calls are enqueued back to back and waited for once at
// the end, as the benchmark driver does, so each event pair times the GPU work alone. Not
// queued: every call is waited for before the next, so the pair also holds the host's work
// between the start event and the first kernel (the launcher's workspace checks, attribute
// calls and allocation), which a caller that synchronizes after each call pays.
double median_ms(DqStrategy strategy, Buffers& b, const AttentionShape& shape, int repeats,
                 bool queued) {
    auto call = [&] {
        attention_backward_with(strategy, b.q.data(), b.k.data(), b.v.data(), b.o.data(),
                                b.lse.data(), b.dout.data(), b.dq.data(), b.dk.data(),
                                b.dv.data(), shape, 0);
    };
    for (int i = 0; i < 3; ++i) call();
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<EventPair> events(repeats);
    for (EventPair& pair : events) {
        CUDA_CHECK(cudaEventRecord(pair.start));
        call();
        CUDA_CHECK(cudaEventRecord(pair.stop));
        if (!queued) CUDA_CHECK(cudaEventSynchronize(pair.stop));
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> times;
    for (const EventPair& pair : events) times.push_back(pair.milliseconds());
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

// True when two calls of the strategy give bitwise identical dq, dk and dv.
bool bitwise_repeatable(DqStrategy strategy, Buffers& b, const AttentionShape& shape, int trials,
                        int* differing_dq) {
    std::vector<__nv_bfloat16> first_dq, first_dk, first_dv;
    bool same = true;
    *differing_dq = 0;
    for (int trial = 0; trial < trials; ++trial) {
        attention_backward_with(strategy, b.q.data(), b.k.data(), b.v.data(), b.o.data(),
                                b.lse.data(), b.dout.data(), b.dq.data(), b.dk.data(),
                                b.dv.data(), shape, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        auto dq = b.dq.download(), dk = b.dk.download(), dv = b.dv.download();
        if (trial == 0) {
            first_dq = dq, first_dk = dk, first_dv = dv;
            continue;
        }
        int differing = 0;
        for (size_t i = 0; i < dq.size(); ++i)
            differing += std::memcmp(&dq[i], &first_dq[i], sizeof(dq[i])) != 0;
        *differing_dq = std::max(*differing_dq, differing);
        same = same && differing == 0 &&
               std::memcmp(dk.data(), first_dk.data(), dk.size() * sizeof(dk[0])) == 0 &&
               std::memcmp(dv.data(), first_dv.data(), dv.size() * sizeof(dv[0])) == 0;
    }
    return same;
}

}  // namespace

int main() {
    const AttentionShape shapes[] = {make_shape(1, 8, 4096, 8192, 128), make_shape(4, 8, 4096, 4096, 64),
                                     make_shape(1, 8, 4096, 8192, 128, true),
                                     make_shape(4, 8, 4096, 4096, 64, true),
                                     make_shape(1, 32, 2048, 2048, 128)};
    std::printf("backward FLOPs = 2.5 x 4*B*H*Lq*Lk*D (halved when causal); median of 20 calls "
                "queued back to back (TFLOP/s), and of 20 calls each waited for (the 'waited' ms)\n");
    for (const AttentionShape& shape : shapes) {
        Buffers b;
        const size_t nq = size_t(shape.q_elements()), nk = size_t(shape.kv_elements());
        b.q = DeviceBuffer<__nv_bfloat16>(nq);
        b.k = DeviceBuffer<__nv_bfloat16>(nk);
        b.v = DeviceBuffer<__nv_bfloat16>(nk);
        b.o = DeviceBuffer<__nv_bfloat16>(nq);
        b.dout = DeviceBuffer<__nv_bfloat16>(nq);
        b.dq = DeviceBuffer<__nv_bfloat16>(nq);
        b.dk = DeviceBuffer<__nv_bfloat16>(nk);
        b.dv = DeviceBuffer<__nv_bfloat16>(nk);
        b.lse = DeviceBuffer<float>(size_t(shape.lse_elements()));
        b.q.upload(from_float<__nv_bfloat16>(random_inputs(nq, 1)));
        b.k.upload(from_float<__nv_bfloat16>(random_inputs(nk, 2)));
        b.v.upload(from_float<__nv_bfloat16>(random_inputs(nk, 3)));
        b.dout.upload(from_float<__nv_bfloat16>(random_inputs(nq, 4)));
        attention_forward(b.q.data(), b.k.data(), b.v.data(), b.o.data(), b.lse.data(), shape);
        CUDA_CHECK(cudaDeviceSynchronize());
        for (DqStrategy strategy : {DqStrategy::atomic, DqStrategy::second_kernel}) {
            const double ms = median_ms(strategy, b, shape, 20, true);
            const double waited_ms = median_ms(strategy, b, shape, 20, false);
            int differing = 0;
            const bool same = bitwise_repeatable(strategy, b, shape, 4, &differing);
            std::printf("%-36s %-13s %8.3f ms %7.1f TFLOP/s  waited %8.3f ms  repeatable=%s (dq "
                        "elements differing: %d of %zu)\n",
                        shape.to_string().c_str(),
                        strategy == DqStrategy::atomic ? "atomic" : "second_kernel", ms,
                        backward_flops(shape) / (ms * 1e-3) / 1e12, waited_ms, same ? "yes" : "no",
                        differing, nq);
        }
    }
    return 0;
}
