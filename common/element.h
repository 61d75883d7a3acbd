// The element type a stage is built for, chosen by DTYPE in its Makefile.
#pragma once
#include <cuda_bf16.h>

#if defined(ATTENTION_DTYPE_BF16)
using Element = __nv_bfloat16;
inline constexpr const char* kElementName = "bf16";
#else
using Element = float;
inline constexpr const char* kElementName = "fp32";
#endif
