#include "workspace.h"

#include <cstdint>

#include "cuda_check.h"
#include "validate.h"

namespace {

// Free device memory plus what the stream-ordered pool holds but does not use: a launcher
// called in a loop gets its previous workspace back from the pool.
size_t available_device_bytes() {
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t reserved = 0, used = 0;
    CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
    CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    return free_bytes + size_t(reserved > used ? reserved - used : 0);
}

}  // namespace

void Workspace::require_fits(size_t bytes) {
    if (bytes == 0) return;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
        // No GPU or driver: nothing to measure against (the launch reports the missing GPU);
        // clear the error so that the next CUDA call does not inherit it.
        cudaGetLastError();
        return;
    }
    validate_workspace(bytes, available_device_bytes());
}

Workspace::Workspace(size_t bytes, cudaStream_t stream) : bytes_(bytes), stream_(stream) {
    if (bytes_ == 0) return;
    validate_workspace(bytes_, available_device_bytes());
    CUDA_CHECK(cudaMallocAsync(&data_, bytes_, stream_));
}

Workspace::~Workspace() {
    // A destructor must not throw; a failure here resurfaces at the next checked CUDA call.
    if (data_) cudaFreeAsync(data_, stream_);
}
