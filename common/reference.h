// FP64 reference attention on the CPU: the ground truth every stage is tested against.
// Inputs are float; the bf16 stages pass their bf16-rounded inputs so that only the kernel's
// arithmetic is measured.
#pragma once

#include <vector>

#include "attention.h"

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
