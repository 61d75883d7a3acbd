// Device scratch memory a launcher needs for one call, stream-ordered so that it costs no
// device-wide synchronization. Refuses, before anything is launched, what cannot fit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include <cuda_runtime.h>

// The product of sizes, saturated at SIZE_MAX where it would wrap: a workspace that large is
// then refused as larger than the device, instead of wrapping to a small allocation.
inline size_t saturating_product(std::initializer_list<size_t> factors) {
    size_t product = 1;
    for (size_t factor : factors) {
        if (factor != 0 && product > SIZE_MAX / factor) return SIZE_MAX;
        product *= factor;
    }
    return product;
}

class Workspace {
public:
    // Throws std::invalid_argument when `bytes` exceed the device's free memory.
    Workspace(size_t bytes, cudaStream_t stream);
    // The same refusal without allocating: a launcher checks it with the shape, before the
    // pointers (whose extents, for a shape that cannot fit, may well overlap).
    static void require_fits(size_t bytes);
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
