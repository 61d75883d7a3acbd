// AttentionShape's methods and make_shape (attention.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "attention.h"

float AttentionShape::softmax_scale() const {
    return scale != 0.0f ? scale : 1.0f / std::sqrt(float(head_dim));
}

int64_t AttentionShape::attended_pairs() const {
    int64_t per_head = int64_t(len_q) * len_kv;
    if (causal) {
        // Row i sees keys 0..min(i, len_kv - 1).
        const int64_t full_rows = std::max<int64_t>(0, int64_t(len_q) - len_kv);
        const int64_t triangle_rows = len_q - full_rows;  // rows i < len_kv
        per_head = triangle_rows * (triangle_rows + 1) / 2 + full_rows * len_kv;
    }
    return int64_t(batch) * heads * per_head;
}

std::string AttentionShape::to_string() const {
    std::ostringstream out;
    out << "B=" << batch << " H=" << heads << " Lq=" << len_q << " Lk=" << len_kv
        << " D=" << head_dim << (causal ? " causal" : "");
    if (scale != 0.0f) out << " scale=" << scale;
    if (deterministic) out << " deterministic";
    return out.str();
}

AttentionShape make_shape(int batch, int heads, int len_q, int len_kv, int head_dim, bool causal,
                          float scale) {
    AttentionShape shape;
    shape.batch = batch;
    shape.heads = heads;
    shape.len_q = len_q;
    shape.len_kv = len_kv;
    shape.head_dim = head_dim;
    shape.causal = causal;
    shape.scale = scale;
    return shape;
}
