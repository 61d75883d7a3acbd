#include "reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "harness.h"

int64_t visible_keys(const AttentionShape& shape, int64_t row) {
    return shape.causal ? std::min<int64_t>(row + 1, shape.len_kv) : shape.len_kv;
}

QueryRow query_row(const AttentionShape& shape, const float* q, const float* k, const float* v,
                   int64_t row_index) {
    const int64_t D = shape.head_dim, Lq = shape.len_q, Lk = shape.len_kv;
    const int64_t head = row_index / Lq;
    return {q + row_index * D, k + head * Lk * D, v + head * Lk * D, visible_keys(shape, row_index % Lq)};
}

double scaled_scores(const float* q_row, const float* k_head, int64_t keys, int64_t head_dim,
                     double scale, double* scores) {
    double max_score = -INFINITY;
    for (int64_t j = 0; j < keys; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < head_dim; ++d) dot += double(q_row[d]) * double(k_head[j * head_dim + d]);
        scores[j] = dot * scale;
        max_score = std::max(max_score, scores[j]);
    }
    return max_score;
}

void reference_forward(const AttentionShape& shape, const float* q, const float* k,
                       const float* v, double* o, double* lse) {
    const int64_t D = shape.head_dim, Lq = shape.len_q;
    const double scale = shape.softmax_scale();
    parallel_for(int64_t(shape.batch) * shape.heads * Lq, [&](int64_t row_index) {
        const QueryRow row = query_row(shape, q, k, v, row_index);
        const float *q_row = row.q, *k_head = row.k, *v_head = row.v;
        const int64_t keys = row.keys;

        std::vector<double> scores(static_cast<size_t>(keys));
        const double max_score = scaled_scores(q_row, k_head, keys, D, scale, scores.data());
        double sum = 0;
        std::vector<double> accumulator(size_t(D), 0.0);
        for (int64_t j = 0; j < keys; ++j) {
            const double p = std::exp(scores[size_t(j)] - max_score);
            sum += p;
            for (int64_t d = 0; d < D; ++d) accumulator[size_t(d)] += p * v_head[j * D + d];
        }
        for (int64_t d = 0; d < D; ++d) o[row_index * D + d] = accumulator[size_t(d)] / sum;
        if (lse) lse[row_index] = max_score + std::log(sum);
    });
}

void emulated_bf16_forward(const AttentionShape& shape, const float* q, const float* k,
                           const float* v, float* o) {
    const int64_t D = shape.head_dim, Lq = shape.len_q;
    const float scale = shape.softmax_scale();
    parallel_for(int64_t(shape.batch) * shape.heads * Lq, [&](int64_t row_index) {
        const QueryRow row = query_row(shape, q, k, v, row_index);
        const float *q_row = row.q, *k_head = row.k, *v_head = row.v;
        const int64_t keys = row.keys;

        std::vector<float> scores(static_cast<size_t>(keys));
        float max_score = -INFINITY;
        for (int64_t j = 0; j < keys; ++j) {
            float dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += q_row[d] * k_head[j * D + d];
            scores[size_t(j)] = dot * scale;
            max_score = std::max(max_score, scores[size_t(j)]);
        }
        float sum = 0;
        std::vector<float> accumulator(size_t(D), 0.0f);
        for (int64_t j = 0; j < keys; ++j) {
            const float p = std::exp(scores[size_t(j)] - max_score);
            sum += p;
            const float p_bf16 = round_to_bf16(p);
            for (int64_t d = 0; d < D; ++d) accumulator[size_t(d)] += p_bf16 * v_head[j * D + d];
        }
        for (int64_t d = 0; d < D; ++d)
            o[row_index * D + d] = round_to_bf16(accumulator[size_t(d)] / sum);
    });
}
