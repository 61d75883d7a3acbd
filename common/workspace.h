// Device scratch memory a launcher needs for one call, stream-ordered so that it costs no
// device-wide synchronization. Refuses, before anything is launched, what cannot fit.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

class Workspace {
public:
    // Throws std::invalid_argument when `bytes` exceed the device's free memory.
    Workspace(size_t bytes, cudaStream_t stream);
    ~Workspace();
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;

    template <class T>
    T* as() const { return static_cast<T*>(data_); }
    size_t bytes() const { return bytes_; }

private:
    void* data_ = nullptr;
    size_t bytes_ = 0;
    cudaStream_t stream_ = nullptr;
};
