#include "cuda_check.h"

#include <sstream>

void throw_cuda_error(cudaError_t status, const char* expression, const char* file, int line) {
    std::ostringstream message;
    message << "CUDA error " << cudaGetErrorName(status) << " (" << cudaGetErrorString(status)
            << ") at " << file << ":" << line << " in " << expression;
    throw std::runtime_error(message.str());
}
