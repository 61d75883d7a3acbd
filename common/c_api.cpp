// The C ABI of common/attention_c.h over the C++ contract of common/attention.h: one thin
// wrapper per function that converts the arguments, calls the stage's C++ entry point and turns
// every exception into an error code and the calling thread's last-error message. Nothing is
// thrown across the C boundary, nothing is printed. Compiled once per variant (element type,
// backward pass), like the shared test objects; linked into each suite's shared library
// (common/stage.mk) and its test binary (the host cases of test_host.cpp call it).
#include "attention_c.h"

#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "attention.h"
#include "element.h"
#include "stage_name.h"
#include "validate.h"

namespace {

// The calling thread's last message; `lost` when even the message could not be stored.
thread_local std::string last_message;
thread_local bool last_message_lost = false;

void record(const char* message) noexcept {
    try {
        last_message = message;
        last_message_lost = false;
    } catch (...) {
        last_message.clear();
        last_message_lost = true;
    }
}

// Runs body(), mapping its outcome to a code: std::invalid_argument is bad input; everything
// else, std::runtime_error (CUDA) first, is a runtime error.
template <class Body>
int guarded(Body&& body) noexcept {
    try {
        body();
        record("");
        return ATTENTION_C_OK;
    } catch (const std::invalid_argument& error) {
        record(error.what());
        return ATTENTION_C_INVALID_ARGUMENT;
    } catch (const std::exception& error) {
        record(error.what());
        return ATTENTION_C_RUNTIME_ERROR;
    } catch (...) {
        record("attention: an unknown exception in the stage's code");
        return ATTENTION_C_RUNTIME_ERROR;
    }
}

[[noreturn]] void reject_null(const char* field, const char* allowed) {
    throw std::invalid_argument(std::string("attention: ") + field +
                                " = null is not allowed: " + allowed);
}

AttentionShape to_shape(const AttentionCShape* shape) {
    if (shape == nullptr) reject_null("shape", "must point to an AttentionCShape");
    // C ints, not bools: only 0 and 1 mean something, and any other value is refused rather
    // than read as true.
    if (shape->causal != 0 && shape->causal != 1)
        throw std::invalid_argument("attention: causal = " + std::to_string(shape->causal) +
                                    " is not allowed: must be 0 or 1");
    if (shape->deterministic != 0 && shape->deterministic != 1)
        throw std::invalid_argument("attention: deterministic = " +
                                    std::to_string(shape->deterministic) +
                                    " is not allowed: must be 0 or 1");
    AttentionShape converted = make_shape(shape->batch, shape->heads, shape->len_q,
                                          shape->len_kv, shape->head_dim, shape->causal == 1,
                                          shape->scale);
    converted.deterministic = shape->deterministic == 1;
    return converted;
}

#ifndef ATTENTION_HAS_BACKWARD
[[noreturn]] void no_backward() {
    throw std::invalid_argument(std::string("attention: ") + attention_stage_name() +
                                " has no backward pass");
}
#endif

// Copies a string into a fixed field of the record, refusing (rather than cutting) one that
// does not fit: a truncated name would name another stage.
template <size_t N>
void copy_field(char (&field)[N], const std::string& value, const char* what) {
    if (value.size() >= N)
        throw std::runtime_error(std::string("attention: the stage's ") + what + " \"" + value +
                                 "\" does not fit the C record's " + std::to_string(N - 1) +
                                 " characters");
    std::memcpy(field, value.c_str(), value.size() + 1);
}

}  // namespace

extern "C" {

int attention_c_abi_version(void) { return ATTENTION_C_ABI_VERSION; }

int attention_c_capabilities(AttentionCCapabilities* out) {
    return guarded([&] {
        if (out == nullptr) reject_null("out", "must point to an AttentionCCapabilities");
        const StageCapabilities& caps = stage_capabilities();
        AttentionCCapabilities record{};
        copy_field(record.name, caps.name, "name");
        copy_field(record.dtype, caps.dtype, "dtype");
        constexpr size_t slots = sizeof(record.head_dims) / sizeof(record.head_dims[0]);
        if (caps.head_dims.size() > slots)
            throw std::runtime_error("attention: " + caps.name + " supports " +
                                     std::to_string(caps.head_dims.size()) +
                                     " head dims, the C record holds " + std::to_string(slots));
        for (size_t i = 0; i < caps.head_dims.size(); ++i) record.head_dims[i] = caps.head_dims[i];
        record.head_dim_count = int(caps.head_dims.size());
        record.max_len_q = caps.max_len_q;
        record.max_len_kv = caps.max_len_kv;
        record.causal = caps.causal ? 1 : 0;
        record.backward = caps.backward ? 1 : 0;
        record.alignment_bytes = caps.alignment_bytes;
        record.compute_capability = caps.compute_capability;
        record.deterministic_backward = caps.deterministic_backward ? 1 : 0;
        record.key_centre_backward = caps.key_centre_backward ? 1 : 0;
        *out = record;  // written only when the whole record is good
    });
}

int attention_c_workspace_bytes(const AttentionCShape* shape, size_t* bytes) {
    return guarded([&] {
        if (bytes == nullptr) reject_null("bytes", "must point to a size_t");
        *bytes = 0;
        const AttentionShape s = to_shape(shape);
        validate_shape(s, stage_capabilities());
        *bytes = attention_workspace_bytes(s);
    });
}

int attention_c_backward_workspace_bytes(const AttentionCShape* shape, size_t* bytes) {
    return guarded([&] {
        if (bytes == nullptr) reject_null("bytes", "must point to a size_t");
        *bytes = 0;
#ifdef ATTENTION_HAS_BACKWARD
        const AttentionShape s = to_shape(shape);
        // A stage without the deterministic mode would answer the default's workspace, which
        // would read as what the mode needs: refused, as its backward refuses the shape.
        validate_deterministic(s, stage_capabilities());
        validate_shape(s, stage_capabilities());
        *bytes = attention_backward_workspace_bytes(s);
#else
        (void)shape;
        no_backward();
#endif
    });
}

int attention_c_forward(const void* q, const void* k, const void* v, void* o, float* lse,
                        const AttentionCShape* shape, void* stream) {
    return guarded([&] {
        attention_forward(static_cast<const Element*>(q), static_cast<const Element*>(k),
                          static_cast<const Element*>(v), static_cast<Element*>(o), lse,
                          to_shape(shape), static_cast<cudaStream_t>(stream));
    });
}

int attention_c_backward(const void* q, const void* k, const void* v, const void* o,
                         const float* lse, const void* dout, void* dq, void* dk, void* dv,
                         const float* key_centre, const AttentionCShape* shape, void* stream) {
    return guarded([&] {
#ifdef ATTENTION_HAS_BACKWARD
        attention_backward(static_cast<const Element*>(q), static_cast<const Element*>(k),
                           static_cast<const Element*>(v), static_cast<const Element*>(o), lse,
                           static_cast<const Element*>(dout), static_cast<Element*>(dq),
                           static_cast<Element*>(dk), static_cast<Element*>(dv),
                           to_shape(shape), static_cast<cudaStream_t>(stream), key_centre);
#else
        (void)q, (void)k, (void)v, (void)o, (void)lse, (void)dout, (void)dq, (void)dk, (void)dv;
        (void)key_centre;
        (void)shape, (void)stream;
        no_backward();
#endif
    });
}

const char* attention_c_last_error(void) {
    return last_message_lost ? "attention: out of memory while storing the last error's message"
                             : last_message.c_str();
}

}  // extern "C"
