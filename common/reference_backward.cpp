// FP64 reference backward on the CPU: dQ, dK, dV of loss = sum(dout * O) for the attention
// that reference_forward computes. The ground truth stage 07 is tested against.
//
//   S = scale Q K^T (masked),  P = softmax(S) row by row,  O = P V
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(P * dP)),  dQ = scale dS K,  dK = scale dS^T Q
//
// rowsum(P * dP) equals rowsum(dO * O) (the identity the GPU kernels use); here it is computed
// the long way, from P and dP, so that the test of the identity is not circular.
#include <algorithm>
#include <cmath>
#include <vector>

#include "harness.h"
#include "reference.h"

void reference_backward(const AttentionShape& shape, const float* q, const float* k,
                        const float* v, const float* dout, double* dq, double* dk, double* dv) {
    const int64_t D = shape.head_dim, Lq = shape.len_q, Lk = shape.len_kv;
    const double scale = shape.softmax_scale();
    // dK and dV sum over every query of a head, so one task owns one (batch, head): no two
    // tasks ever write the same element.
    parallel_for(int64_t(shape.batch) * shape.heads, [&](int64_t head) {
        const float* q_head = q + head * Lq * D;
        const float* k_head = k + head * Lk * D;
        const float* v_head = v + head * Lk * D;
        const float* do_head = dout + head * Lq * D;
        double* dq_head = dq + head * Lq * D;
        double* dk_head = dk + head * Lk * D;
        double* dv_head = dv + head * Lk * D;
        std::fill(dk_head, dk_head + Lk * D, 0.0);
        std::fill(dv_head, dv_head + Lk * D, 0.0);

        std::vector<double> p(static_cast<size_t>(Lk)), dp(static_cast<size_t>(Lk));
        for (int64_t i = 0; i < Lq; ++i) {
            const float* q_row = q_head + i * D;
            const float* do_row = do_head + i * D;
            const int64_t keys = visible_keys(shape, i);
            const double max_score = scaled_scores(q_row, k_head, keys, D, scale, p.data());
            double sum = 0;
            for (int64_t j = 0; j < keys; ++j) {
                p[size_t(j)] = std::exp(p[size_t(j)] - max_score);
                sum += p[size_t(j)];
            }
            double p_dot_dp = 0;  // rowsum(P * dP)
            for (int64_t j = 0; j < keys; ++j) {
                p[size_t(j)] /= sum;
                double dot = 0;
                for (int64_t d = 0; d < D; ++d) dot += double(do_row[d]) * double(v_head[j * D + d]);
                dp[size_t(j)] = dot;
                p_dot_dp += p[size_t(j)] * dot;
            }

            double* dq_row = dq_head + i * D;
            std::fill(dq_row, dq_row + D, 0.0);
            for (int64_t j = 0; j < keys; ++j) {
                const double pj = p[size_t(j)];
                const double ds = pj * (dp[size_t(j)] - p_dot_dp) * scale;
                const float* k_row = k_head + j * D;
                double* dk_row = dk_head + j * D;
                double* dv_row = dv_head + j * D;
                for (int64_t d = 0; d < D; ++d) {
                    dq_row[d] += ds * k_row[d];
                    dk_row[d] += ds * q_row[d];
                    dv_row[d] += pj * do_row[d];
                }
            }
        }
    });
}
