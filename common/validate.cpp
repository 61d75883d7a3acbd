#include "validate.h"

#include "harness.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>

namespace {

[[noreturn]] void reject(const std::string& field, const std::string& value,
                         const std::string& allowed) {
    throw std::invalid_argument("attention: " + field + " = " + value + " is not allowed: " +
                                allowed);
}

std::string list(const std::vector<int>& values) {
    std::ostringstream out;
    for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
    return out.str();
}

void require_positive(const char* field, int value) {
    if (value < 1) reject(field, std::to_string(value), "must be at least 1");
}

}  // namespace

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

void validate_shape(const AttentionShape& shape, const StageCapabilities& caps) {
    require_positive("batch", shape.batch);
    require_positive("heads", shape.heads);
    require_positive("len_q", shape.len_q);
    require_positive("len_kv", shape.len_kv);
    require_positive("head_dim", shape.head_dim);
    if (std::find(caps.head_dims.begin(), caps.head_dims.end(), shape.head_dim) ==
        caps.head_dims.end())
        reject("head_dim", std::to_string(shape.head_dim),
               caps.name + " supports head_dim in {" + list(caps.head_dims) + "}");
    if (shape.len_q > caps.max_len_q)
        reject("len_q", std::to_string(shape.len_q),
               caps.name + " supports len_q from 1 to " + std::to_string(caps.max_len_q));
    if (shape.len_kv > caps.max_len_kv)
        reject("len_kv", std::to_string(shape.len_kv),
               caps.name + " supports len_kv from 1 to " + std::to_string(caps.max_len_kv));
    if (shape.causal && !caps.causal)
        reject("causal", "true", caps.name + " supports only causal = false");
    // The grid puts batch * heads in one dimension; keep it inside gridDim's 2^31 - 1.
    if (int64_t(shape.batch) * shape.heads > INT32_MAX)
        reject("batch * heads", std::to_string(int64_t(shape.batch) * shape.heads),
               "must be at most 2^31 - 1");
    if (!std::isfinite(shape.scale) || shape.scale < 0.0f) {
        std::ostringstream value;
        value << shape.scale;
        reject("scale", value.str(), "must be finite and positive (0 selects 1/sqrt(head_dim))");
    }
}

void validate_pointer(const char* field, const void* pointer, int alignment_bytes,
                      bool may_be_null) {
    if (pointer == nullptr) {
        if (may_be_null) return;
        reject(field, "null", "must point to device memory");
    }
    const auto address = reinterpret_cast<uintptr_t>(pointer);
    if (alignment_bytes > 1 && address % uintptr_t(alignment_bytes) != 0) {
        std::ostringstream value;
        value << pointer;
        reject(field, value.str(),
               "must be aligned to " + std::to_string(alignment_bytes) + " bytes");
    }
}

// A stage built for one compute capability (the Hopper stages, sm_90a) refuses any other GPU
// before it launches: its kernels have no code for it.
void require_gpu(const StageCapabilities& caps) {
    if (caps.compute_capability == 0) return;
    const std::string unusable = gpu_unusable_reason(caps);
    if (!unusable.empty()) throw std::runtime_error("attention: " + caps.name + " " + unusable);
}

void validate_forward(const AttentionShape& shape, const StageCapabilities& caps, const void* q,
                      const void* k, const void* v, const void* o, const void* lse) {
    validate_shape(shape, caps);
    validate_pointer("q", q, caps.alignment_bytes);
    validate_pointer("k", k, caps.alignment_bytes);
    validate_pointer("v", v, caps.alignment_bytes);
    validate_pointer("o", o, caps.alignment_bytes);
    validate_pointer("lse", lse, alignof(float), /*may_be_null=*/true);
    require_gpu(caps);
}

void validate_backward(const AttentionShape& shape, const StageCapabilities& caps, const void* q,
                       const void* k, const void* v, const void* o, const void* lse,
                       const void* dout, const void* dq, const void* dk, const void* dv) {
    if (!caps.backward)
        throw std::invalid_argument("attention: backward is not implemented by " + caps.name);
    validate_shape(shape, caps);
    validate_pointer("q", q, caps.alignment_bytes);
    validate_pointer("k", k, caps.alignment_bytes);
    validate_pointer("v", v, caps.alignment_bytes);
    validate_pointer("o", o, caps.alignment_bytes);
    validate_pointer("lse", lse, alignof(float));
    validate_pointer("dout", dout, caps.alignment_bytes);
    validate_pointer("dq", dq, caps.alignment_bytes);
    validate_pointer("dk", dk, caps.alignment_bytes);
    validate_pointer("dv", dv, caps.alignment_bytes);
    require_gpu(caps);
}

void validate_workspace(size_t needed, size_t available) {
    if (needed > available)
        reject("workspace", std::to_string(needed) + " bytes",
               "the device has " + std::to_string(available) + " bytes free");
}
