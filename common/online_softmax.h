// The merge rule of the online softmax (stage 03 derives it): two partial states over
// disjoint sets of scores combine exactly into the state over their union.
#pragma once

#include <cmath>

struct SoftmaxState {
    double max;  // m: the largest score seen
    double sum;  // l: sum of exp(score - m) over the scores seen
};

inline SoftmaxState online_softmax_merge(SoftmaxState a, SoftmaxState b) {
    const double m = a.max > b.max ? a.max : b.max;
    if (m == -INFINITY) return {m, 0.0};
    return {m, a.sum * std::exp(a.max - m) + b.sum * std::exp(b.max - m)};
}
