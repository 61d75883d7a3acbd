#include "validate.h"

#include "harness.h"

#include <algorithm>
#include <cfloat>
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
    if (!std::isfinite(shape.scale) || shape.scale < 0.0f || shape.scale > kMaxScale) {
        std::ostringstream value;
        value << shape.scale;
        reject("scale", value.str(),
               "must be positive and at most 2^16 (0 selects 1/sqrt(head_dim))");
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

const char* device_pointer_problem(const cudaPointerAttributes& attributes) {
    switch (attributes.type) {
    case cudaMemoryTypeDevice:
    case cudaMemoryTypeManaged:
        return nullptr;
    case cudaMemoryTypeHost:
        // Pinned host memory is addressable by kernels only where it is mapped.
        return attributes.devicePointer != nullptr ? nullptr : "is pinned host memory the GPU cannot address";
    default:
        return "is host memory (not allocated with cudaMalloc)";
    }
}

void validate_device_pointer(const char* field, const void* pointer) {
    if (pointer == nullptr) return;
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
        // No GPU or no driver: nothing can tell the memory's kind, and the launch reports the
        // missing GPU. Clear the error, so that the next CUDA call does not inherit it.
        cudaGetLastError();
        return;
    }
    if (const char* problem = device_pointer_problem(attributes)) {
        std::ostringstream value;
        value << pointer;
        reject(field, value.str(), std::string("must point to device memory; it ") + problem);
    }
}

void validate_no_overlap(const std::vector<Span>& outputs, const std::vector<Span>& inputs) {
    auto overlap = [](const Span& a, const Span& b) {
        if (a.pointer == nullptr || b.pointer == nullptr || a.bytes == 0 || b.bytes == 0)
            return false;
        const auto a0 = reinterpret_cast<uintptr_t>(a.pointer);
        const auto b0 = reinterpret_cast<uintptr_t>(b.pointer);
        return a0 < b0 + b.bytes && b0 < a0 + a.bytes;
    };
    for (size_t i = 0; i < outputs.size(); ++i) {
        for (const Span& input : inputs)
            if (overlap(outputs[i], input))
                reject(outputs[i].field, "a range overlapping " + std::string(input.field),
                       "an output must not overlap an input");
        for (size_t j = i + 1; j < outputs.size(); ++j)
            if (overlap(outputs[i], outputs[j]))
                reject(outputs[j].field, "a range overlapping " + std::string(outputs[i].field),
                       "outputs must not overlap each other");
    }
}

namespace {

size_t element_bytes(const StageCapabilities& caps) { return caps.dtype == "fp32" ? 4 : 2; }

}  // namespace

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
    const size_t element = element_bytes(caps);
    const size_t q_bytes = size_t(shape.q_elements()) * element;
    const size_t kv_bytes = size_t(shape.kv_elements()) * element;
    const size_t lse_bytes = size_t(shape.lse_elements()) * sizeof(float);
    validate_no_overlap({{"o", o, q_bytes}, {"lse", lse, lse_bytes}},
                        {{"q", q, q_bytes}, {"k", k, kv_bytes}, {"v", v, kv_bytes}});
    for (const auto& [field, pointer] : {std::pair<const char*, const void*>{"q", q}, {"k", k},
                                         {"v", v}, {"o", o}, {"lse", lse}})
        validate_device_pointer(field, pointer);
    require_gpu(caps);
}

void validate_deterministic(const AttentionShape& shape, const StageCapabilities& caps) {
    if (shape.deterministic && !caps.deterministic_backward)
        reject("deterministic", "true",
               caps.name + "'s backward sums dQ across blocks in no fixed order; it supports only "
                           "deterministic = false");
}

void validate_backward(const AttentionShape& shape, const StageCapabilities& caps, const void* q,
                       const void* k, const void* v, const void* o, const void* lse,
                       const void* dout, const void* dq, const void* dk, const void* dv,
                       const void* key_centre) {
    if (!caps.backward)
        throw std::invalid_argument("attention: backward is not implemented by " + caps.name);
    // Before the pointers: a stage that cannot keep the promise says so whatever else is wrong.
    validate_deterministic(shape, caps);
    if (key_centre != nullptr && !caps.key_centre_backward) {
        std::ostringstream value;
        value << key_centre;
        reject("key_centre", value.str(),
               caps.name + "'s backward centres dQ by the mean of the call's own keys; it "
                           "supports only key_centre = null");
    }
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
    validate_pointer("key_centre", key_centre, caps.alignment_bytes, /*may_be_null=*/true);
    const size_t element = element_bytes(caps);
    const size_t q_bytes = size_t(shape.q_elements()) * element;
    const size_t kv_bytes = size_t(shape.kv_elements()) * element;
    const size_t lse_bytes = size_t(shape.lse_elements()) * sizeof(float);
    const size_t centre_bytes = size_t(shape.batch) * shape.heads * shape.head_dim * sizeof(float);
    validate_no_overlap({{"dq", dq, q_bytes}, {"dk", dk, kv_bytes}, {"dv", dv, kv_bytes}},
                        {{"q", q, q_bytes}, {"k", k, kv_bytes}, {"v", v, kv_bytes},
                         {"o", o, q_bytes}, {"lse", lse, lse_bytes}, {"dout", dout, q_bytes},
                         {"key_centre", key_centre, centre_bytes}});
    for (const auto& [field, pointer] :
         {std::pair<const char*, const void*>{"q", q}, {"k", k}, {"v", v}, {"o", o}, {"lse", lse},
          {"dout", dout}, {"dq", dq}, {"dk", dk}, {"dv", dv}})
        validate_device_pointer(field, pointer);
    validate_device_pointer("key_centre", key_centre);
    require_gpu(caps);
}

void validate_workspace(size_t needed, size_t available) {
    if (needed > available)
        reject("workspace", std::to_string(needed) + " bytes",
               "the device has " + std::to_string(available) + " bytes free");
}
