// Host-side plumbing shared by the tests and the benchmark: device buffers, random inputs,
// bf16 rounding, NaN poisoning, error metrics, FLOP and byte counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "attention.h"
#include "cuda_check.h"

bool gpu_available();
// Why the stage's kernels cannot run here ("" when they can): no GPU visible, or a GPU of
// another compute capability than the one the stage was built for.
std::string gpu_unusable_reason(const StageCapabilities& caps);

// Owns `count` elements of device memory.
template <class T>
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t count) : count_(count) {
        if (count_ > 0) CUDA_CHECK(cudaMalloc(&data_, count_ * sizeof(T)));
    }
    ~DeviceBuffer() { if (data_) cudaFree(data_); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    DeviceBuffer(DeviceBuffer&& other) noexcept { swap(other); }
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept { swap(other); return *this; }

    T* data() const { return data_; }
    size_t count() const { return count_; }
    size_t bytes() const { return count_ * sizeof(T); }

    void upload(const std::vector<T>& host) {
        if (host.size() != count_) throw std::invalid_argument("DeviceBuffer::upload: size mismatch");
        if (count_ > 0) CUDA_CHECK(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice));
    }
    std::vector<T> download() const {
        std::vector<T> host(count_);
        if (count_ > 0) CUDA_CHECK(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost));
        return host;
    }
    // All-ones bytes are a NaN in both float and bf16: an element the kernel forgets to
    // write is caught by the NaN count.
    void poison() { if (count_ > 0) CUDA_CHECK(cudaMemset(data_, 0xFF, bytes())); }

private:
    void swap(DeviceBuffer& other) noexcept {
        std::swap(data_, other.data_);
        std::swap(count_, other.count_);
    }
    T* data_ = nullptr;
    size_t count_ = 0;
};

// A pair of CUDA events around one timed region.
struct EventPair {
    cudaEvent_t start = nullptr, stop = nullptr;
    EventPair() {
        CUDA_CHECK(cudaEventCreate(&start));
        CUDA_CHECK(cudaEventCreate(&stop));
    }
    ~EventPair() {
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
    }
    EventPair(const EventPair&) = delete;
    EventPair& operator=(const EventPair&) = delete;
    double milliseconds() const {
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        return ms;
    }
};

// randn + mean (0.5 by default), so that relative errors are not divided by a near-zero norm.
std::vector<float> random_inputs(size_t count, uint64_t seed, float mean = 0.5f);
// A seed that differs between runs; tests print it when they fail.
uint64_t fresh_seed();

// bf16 with round-to-nearest-even, written out so the test suite can check it bit by bit.
uint16_t bf16_bits_from_float(float value);
float float_from_bf16_bits(uint16_t bits);
float round_to_bf16(float value);
std::vector<float> rounded_to_bf16(const std::vector<float>& values);

// Conversions between the host float vectors the reference uses and a stage's element type.
template <class T> std::vector<T> from_float(const std::vector<float>& values);
template <class T> std::vector<float> to_float(const std::vector<T>& values);

struct ErrorStats {
    double relative_l2 = 0;   // ||out - ref|| / ||ref||, over the finite elements
    double max_abs = 0;       // largest |out - ref| over the finite elements
    int64_t non_finite = 0;   // NaN or Inf in out: every one is a failure
    std::string to_string() const;
};
ErrorStats compare(const std::vector<float>& out, const std::vector<double>& ref);
ErrorStats compare(const std::vector<float>& out, const std::vector<float>& ref);
ErrorStats compare(const std::vector<double>& out, const std::vector<double>& ref);

// FlashAttention's FLOP convention: forward 4*B*H*Lq*Lk*D, halved when causal; backward 2.5x.
double forward_flops(const AttentionShape& shape);
double backward_flops(const AttentionShape& shape);
// The fewest bytes a pass must move through device memory (each input read once, each output
// written once), for the roofline.
double forward_min_bytes(const AttentionShape& shape, int element_bytes);
double backward_min_bytes(const AttentionShape& shape, int element_bytes);

// Runs body(i) for i in [0, count) on all hardware threads.
void parallel_for(int64_t count, const std::function<void(int64_t)>& body);
