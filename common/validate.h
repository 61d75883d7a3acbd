// One validation routine that every launcher calls before it touches the device.
#pragma once

#include <cstddef>
#include <string>

#include "attention.h"

// Throws std::invalid_argument naming the field, its value and what is allowed.
void validate_shape(const AttentionShape& shape, const StageCapabilities& caps);
void validate_pointer(const char* field, const void* pointer, int alignment_bytes,
                      bool may_be_null = false);

// A stage built for one compute capability only (caps.compute_capability != 0) throws
// std::runtime_error on any other GPU.
void require_gpu(const StageCapabilities& caps);

// Shape, limits, every pointer (lse may be null), then the GPU.
void validate_forward(const AttentionShape& shape, const StageCapabilities& caps, const void* q,
                      const void* k, const void* v, const void* o, const void* lse);
void validate_backward(const AttentionShape& shape, const StageCapabilities& caps, const void* q,
                       const void* k, const void* v, const void* o, const void* lse,
                       const void* dout, const void* dq, const void* dk, const void* dv);

// Throws std::invalid_argument when `needed` bytes of workspace exceed `available`.
void validate_workspace(size_t needed, size_t available);
