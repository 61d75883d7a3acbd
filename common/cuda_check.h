// CUDA errors become std::runtime_error carrying the CUDA error string and the place.
#pragma once

#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* expression, const char* file,
                                   int line);

#define CUDA_CHECK(expression)                                                       \
    do {                                                                             \
        cudaError_t cuda_check_status_ = (expression);                               \
        if (cuda_check_status_ != cudaSuccess)                                       \
            throw_cuda_error(cuda_check_status_, #expression, __FILE__, __LINE__);   \
    } while (0)

// After a kernel launch: catches bad launch configurations without synchronizing.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
