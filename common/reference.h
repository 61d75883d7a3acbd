// FP64 reference attention on the CPU: the ground truth every stage is tested against.
// Inputs are float; the bf16 stages pass their bf16-rounded inputs so that only the kernel's
// arithmetic is measured.
#pragma once

#include <cstdint>
#include <vector>

#include "attention.h"

// Keys query row `row` attends: j < visible_keys(shape, row). Top-left causal alignment, as
// PyTorch's is_causal: query i sees key j iff j <= i.
int64_t visible_keys(const AttentionShape& shape, int64_t row);

// What the forward references need of one query row; row_index counts the rows of all heads
// ([batch * heads * len_q]): the row of Q, its head's K and V, and the keys the row sees.
struct QueryRow {
    const float* q;
    const float* k;
    const float* v;
    int64_t keys;
};
QueryRow query_row(const AttentionShape& shape, const float* q, const float* k, const float* v,
                   int64_t row_index);

// scores[j] = scale * (q_row . k_j) in FP64 for the first `keys` rows of k_head ([*, head_dim]);
// returns their max (-inf when keys is 0). The first step of both FP64 references.
double scaled_scores(const float* q_row, const float* k_head, int64_t keys, int64_t head_dim,
                     double scale, double* scores);

// o: [B, H, Lq, D]; lse: [B, H, Lq], natural log of the sum of exp of the scaled, masked scores.
void reference_forward(const AttentionShape& shape, const float* q, const float* k,
                       const float* v, double* o, double* lse);

// A plain bf16 implementation, for the "no worse than twice plain bf16" check: FP32 scores
// and softmax, P rounded to bf16 before P V (as a tensor-core kernel feeds it), O rounded.
void emulated_bf16_forward(const AttentionShape& shape, const float* q, const float* k,
                           const float* v, float* o);

// dq, dk, dv in FP64 from the forward inputs and dout (defined in reference_backward.cpp).
void reference_backward(const AttentionShape& shape, const float* q, const float* k,
                        const float* v, const float* dout, double* dq, double* dk, double* dv);
