// cuBLAS failures become std::runtime_error carrying cuBLAS's own status string and the place,
// like CUDA_CHECK does for the runtime (used by the ceilings and the cuBLAS eager baseline).
#pragma once

#include <stdexcept>
#include <string>

#include <cublas_v2.h>

#define CUBLAS_CHECK(expression)                                                             \
    do {                                                                                     \
        cublasStatus_t cublas_check_status_ = (expression);                                  \
        if (cublas_check_status_ != CUBLAS_STATUS_SUCCESS)                                   \
            throw std::runtime_error(                                                        \
                std::string("cuBLAS error ") + cublasGetStatusString(cublas_check_status_) + \
                " in " + #expression + " at " + __FILE__ + ":" + std::to_string(__LINE__));  \
    } while (0)
