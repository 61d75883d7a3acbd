// The merge rule of stage 03, for whole partial results: a query row that attended two disjoint
// sets of keys A and B holds, for each, its normalized output O_A, O_B and its log-sum-exp
// LSE_A, LSE_B (LSE = m + log l, stage 03's running max and sum in one number). The row over
// A and B together is
//
//   LSE = log(exp(LSE_A) + exp(LSE_B))
//   O   = exp(LSE_A - LSE) O_A + exp(LSE_B - LSE) O_B
//
// One function gives both weights and the new LSE; the CUDA merge kernel (attention.cu) calls it
// in FP32 and the host simulation of the ring (ring_host.cpp) in FP64, so the tests check the
// very arithmetic the GPU runs. A row that has seen no key yet has LSE = -inf and weight 0.
#pragma once

#include <cmath>

#ifdef __CUDACC__
#define RING_HOST_DEVICE __host__ __device__
#else
#define RING_HOST_DEVICE
#endif

template <class T>
struct MergeWeights {
    T accumulated;  // multiplies the output merged so far
    T partial;      // multiplies the new block's output
    T lse;          // the log-sum-exp over both sets of keys
};

RING_HOST_DEVICE inline float ring_exp(float x) { return expf(x); }
RING_HOST_DEVICE inline double ring_exp(double x) { return exp(x); }
RING_HOST_DEVICE inline float ring_log(float x) { return logf(x); }
RING_HOST_DEVICE inline double ring_log(double x) { return log(x); }

// excerpt: merge-weights
template <class T>
RING_HOST_DEVICE inline MergeWeights<T> merge_weights(T lse_accumulated, T lse_partial) {
    const T m = lse_accumulated > lse_partial ? lse_accumulated : lse_partial;
    // Neither side has seen a key: nothing to weigh, and exp(-inf - -inf) would be NaN.
    if (m == -T(INFINITY)) return {T(0), T(0), -T(INFINITY)};
    // Subtracting the larger LSE keeps both exponentials in (0, 1]: the max trick of stage 03.
    const T a = ring_exp(lse_accumulated - m), b = ring_exp(lse_partial - m);
    const T sum = a + b;
    return {a / sum, b / sum, m + ring_log(sum)};
}
// end excerpt
