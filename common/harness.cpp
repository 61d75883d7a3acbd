#include "harness.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

bool gpu_available() {
    static const bool available = [] {
        int count = 0;
        return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
    }();
    return available;
}

std::string gpu_unusable_reason(const StageCapabilities& caps) {
    if (!gpu_available()) return "no GPU visible";
    if (caps.compute_capability == 0) return "";
    int device = 0;
    cudaDeviceProp properties{};
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaGetDeviceProperties(&properties, device) != cudaSuccess)
        return "the GPU's properties cannot be read";
    const int found = properties.major * 10 + properties.minor;
    if (found == caps.compute_capability) return "";
    return "needs a Hopper GPU (sm_" + std::to_string(caps.compute_capability) + "), this is " +
           properties.name + " (sm_" + std::to_string(found) + ")";
}

std::vector<float> random_inputs(size_t count, uint64_t seed, float mean) {
    std::vector<float> values(count);
    // One generator per chunk keeps large inputs fast to make and still reproducible.
    const size_t chunk = 1 << 16;
    const int64_t chunks = int64_t((count + chunk - 1) / chunk);
    parallel_for(chunks, [&](int64_t c) {
        std::mt19937_64 generator(seed * 0x9E3779B97F4A7C15ull + uint64_t(c));
        std::normal_distribution<float> normal(mean, 1.0f);
        const size_t end = std::min(count, size_t(c + 1) * chunk);
        for (size_t i = size_t(c) * chunk; i < end; ++i) values[i] = normal(generator);
    });
    return values;
}

uint64_t fresh_seed() {
    static std::atomic<uint64_t> counter{0};
    const uint64_t time = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
    return std::random_device{}() ^ (time << 7) ^ (counter++ * 0x2545F4914F6CDD1Dull);
}

uint16_t bf16_bits_from_float(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    if (std::isnan(value)) return uint16_t((bits >> 16) | 0x0040);  // stay a (quiet) NaN
    // Round to nearest, ties to even: add 0x7FFF plus the lowest kept bit, then truncate.
    const uint32_t lowest_kept = (bits >> 16) & 1u;
    return uint16_t((bits + 0x7FFFu + lowest_kept) >> 16);
}

float float_from_bf16_bits(uint16_t bits) {
    const uint32_t wide = uint32_t(bits) << 16;
    float value;
    std::memcpy(&value, &wide, sizeof value);
    return value;
}

float round_to_bf16(float value) { return float_from_bf16_bits(bf16_bits_from_float(value)); }

std::vector<float> rounded_to_bf16(const std::vector<float>& values) {
    std::vector<float> rounded(values.size());
    std::transform(values.begin(), values.end(), rounded.begin(), round_to_bf16);
    return rounded;
}

template <>
std::vector<float> from_float<float>(const std::vector<float>& values) { return values; }
template <>
std::vector<float> to_float<float>(const std::vector<float>& values) { return values; }

template <>
std::vector<__nv_bfloat16> from_float<__nv_bfloat16>(const std::vector<float>& values) {
    std::vector<__nv_bfloat16> out(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
        __nv_bfloat16_raw raw;
        raw.x = bf16_bits_from_float(values[i]);
        out[i] = __nv_bfloat16(raw);
    }
    return out;
}
template <>
std::vector<float> to_float<__nv_bfloat16>(const std::vector<__nv_bfloat16>& values) {
    std::vector<float> out(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
        out[i] = float_from_bf16_bits(__nv_bfloat16_raw(values[i]).x);
    }
    return out;
}

std::string ErrorStats::to_string() const {
    std::ostringstream out;
    out << "relative L2 " << relative_l2 << ", max abs " << max_abs << ", non-finite "
        << non_finite;
    return out.str();
}

namespace {
template <class Out, class Reference>
ErrorStats compare_impl(const std::vector<Out>& out, const std::vector<Reference>& ref) {
    ErrorStats stats;
    if (out.size() != ref.size()) {
        stats.non_finite = int64_t(std::max(out.size(), ref.size()));
        return stats;
    }
    double error_sq = 0, ref_sq = 0;
    for (size_t i = 0; i < out.size(); ++i) {
        const double r = double(ref[i]);
        ref_sq += r * r;
        if (!std::isfinite(out[i])) {
            ++stats.non_finite;
            continue;
        }
        const double diff = double(out[i]) - r;
        error_sq += diff * diff;
        stats.max_abs = std::max(stats.max_abs, std::fabs(diff));
    }
    stats.relative_l2 = ref_sq > 0 ? std::sqrt(error_sq / ref_sq) : std::sqrt(error_sq);
    return stats;
}
}  // namespace

ErrorStats compare(const std::vector<float>& out, const std::vector<double>& ref) {
    return compare_impl(out, ref);
}
ErrorStats compare(const std::vector<float>& out, const std::vector<float>& ref) {
    return compare_impl(out, ref);
}
ErrorStats compare(const std::vector<double>& out, const std::vector<double>& ref) {
    return compare_impl(out, ref);
}

double forward_flops(const AttentionShape& shape) {
    const double full = 4.0 * shape.batch * shape.heads * double(shape.len_q) * shape.len_kv *
                        shape.head_dim;
    return shape.causal ? full / 2 : full;
}

double backward_flops(const AttentionShape& shape) { return 2.5 * forward_flops(shape); }

double forward_min_bytes(const AttentionShape& shape, int element_bytes) {
    // Read Q, K, V; write O and the FP32 LSE.
    return double(element_bytes) * (2.0 * shape.q_elements() + 2.0 * shape.kv_elements()) +
           4.0 * shape.lse_elements();
}

double backward_min_bytes(const AttentionShape& shape, int element_bytes) {
    // Read Q, K, V, O, dO and LSE; write dQ, dK, dV.
    return double(element_bytes) * (4.0 * shape.q_elements() + 4.0 * shape.kv_elements()) +
           4.0 * shape.lse_elements();
}

void parallel_for(int64_t count, const std::function<void(int64_t)>& body) {
    const int64_t workers =
        std::min<int64_t>(count, std::max(1u, std::thread::hardware_concurrency()));
    if (workers <= 1) {
        for (int64_t i = 0; i < count; ++i) body(i);
        return;
    }
    std::atomic<int64_t> next{0};
    std::vector<std::thread> threads;
    for (int64_t w = 0; w < workers; ++w)
        threads.emplace_back([&] {
            for (int64_t i = next++; i < count; i = next++) body(i);
        });
    for (auto& thread : threads) thread.join();
}
