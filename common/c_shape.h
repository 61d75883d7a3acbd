// The C ABI's shape (attention_c.h) from the contract's (attention.h): what a C++ caller of a
// stage's library passes, the reverse of c_api.cpp's to_shape.
#pragma once

#include "attention.h"
#include "attention_c.h"

inline AttentionCShape to_c_shape(const AttentionShape& shape) {
    return {shape.batch,    shape.heads,          shape.len_q, shape.len_kv,
            shape.head_dim, shape.causal ? 1 : 0, shape.scale, shape.deterministic ? 1 : 0};
}
