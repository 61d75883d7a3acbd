// One validation routine that every launcher calls before it touches the device.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "attention.h"

// The largest scale accepted: exp is taken as exp2 of score * scale * log2(e), and this keeps
// that product finite for every score below 2^110 in magnitude (far beyond what finite bf16 or
// FP32 inputs of the supported head dims produce without overflowing the dot product itself).
inline constexpr float kMaxScale = 65536.0f;

// Throws std::invalid_argument naming the field, its value and what is allowed.
void validate_shape(const AttentionShape& shape, const StageCapabilities& caps);
void validate_pointer(const char* field, const void* pointer, int alignment_bytes,
                      bool may_be_null = false);

// Refuses memory a kernel cannot address (plain host memory), naming the field. Where no GPU
// or driver can tell the kind of memory, it accepts the pointer and clears the CUDA error.
void validate_device_pointer(const char* field, const void* pointer);
// Why attributes describe memory a kernel cannot read or write, or null when it can.
const char* device_pointer_problem(const cudaPointerAttributes& attributes);

// A byte range of a tensor argument, for the overlap check.
struct Span {
    const char* field;
    const void* pointer;  // null: absent, overlaps nothing
    size_t bytes;
};
// Refuses an output that overlaps an input or another output, naming it.
void validate_no_overlap(const std::vector<Span>& outputs, const std::vector<Span>& inputs);

// A stage built for one compute capability only (caps.compute_capability != 0) throws
// std::runtime_error on any other GPU.
void require_gpu(const StageCapabilities& caps);

// Shape, limits, every pointer (null, alignment, outputs overlapping inputs or each other,
// memory a kernel cannot address; lse may be null), then the GPU. The backward first refuses
// a stage without one, deterministic = true where caps.deterministic_backward is false (the
// forward accepts it: every forward is deterministic), and a key_centre where
// caps.key_centre_backward is false. key_centre may be null; given, it is
// [batch * heads][head_dim] FP32, aligned as the tensors.
void validate_forward(const AttentionShape& shape, const StageCapabilities& caps, const void* q,
                      const void* k, const void* v, const void* o, const void* lse);
void validate_backward(const AttentionShape& shape, const StageCapabilities& caps, const void* q,
                       const void* k, const void* v, const void* o, const void* lse,
                       const void* dout, const void* dq, const void* dk, const void* dv,
                       const void* key_centre = nullptr);
// The backward's first check after its existence: deterministic = true where
// caps.deterministic_backward is false. Also what the C ABI's backward workspace query asks
// (common/c_api.cpp), which sees no pointers.
void validate_deterministic(const AttentionShape& shape, const StageCapabilities& caps);

// Throws std::invalid_argument when `needed` bytes of workspace exceed `available`.
void validate_workspace(size_t needed, size_t available);
