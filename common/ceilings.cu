// Measures the ceilings declared in ceilings.h: the best cuBLAS BF16 GEMM rate and the best FP32
// GEMM rate without TF32 over a few large shapes, a device-to-device copy and back-to-back
// mma.sync, on the current device.
#include "ceilings.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iterator>
#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cublas_check.h"
#include "cuda_check.h"
#include "harness.h"
#include "ptx.cuh"

namespace {

// The GEMM ceilings are the best rate over these shapes (m x n x k), each timed in several
// rounds after the GPU has been kept busy for a while: one 8192^3 GEMM timed once moved by 15%
// between runs on the same H100 (clocks and power settle differently from run to run), and a
// ceiling that reads low flatters every stage's % of SOL. All are larger than any GEMM of the
// attention sweeps, and large enough that cuBLAS runs its steady-state kernel on every SM.
struct GemmShape {
    int m, n, k;
};
constexpr GemmShape kGemmShapes[] = {{8192, 8192, 8192}, {8192, 8192, 4096}, {16384, 8192, 8192}};
// Each shape: kGemmRounds rounds of about kRoundSeconds of calls; the fastest round's median.
constexpr int kGemmRounds = 3;
constexpr double kRoundSeconds = 0.15;
// Busy time before the first timed GEMM of each element type, for the clocks to settle.
constexpr double kGemmWarmupSeconds = 1.0;
// cuBLAS's workspace, set explicitly so that the choice of kernel does not depend on a default.
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
// Far beyond any L2 cache, so that the copy streams through device memory.
constexpr size_t kCopyBytes = size_t(1) << 30;
// The copy and mma.sync ceilings are timed for about this long after warm-up, within these
// repeat bounds.
constexpr double kTargetSeconds = 0.5;
constexpr int kWarmupCalls = 3;
constexpr int kMinRepeats = 10;
constexpr int kMaxRepeats = 100;

__device__ uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Standard normal values from a counter-based hash: random enough that the GEMMs draw the power
// real data draws (zeros would let the tensor cores run cooler and faster than they ever do on
// attention), and generated on the device so that a gigabyte costs milliseconds.
template <class T>
__global__ void fill_normal_kernel(T* data, size_t count, uint64_t seed) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
        const uint64_t bits = splitmix64(seed ^ (i * 0xD6E8FEB86659FD93ull));
        // Box-Muller on the two 32-bit halves; the +1 keeps the logarithm's argument above zero.
        const float u1 = (float(uint32_t(bits)) + 1.0f) * 0x1p-32f;
        const float u2 = float(uint32_t(bits >> 32)) * 0x1p-32f;
        const float normal = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
        data[i] = T(normal);
    }
}

template <class T>
void fill_normal(T* data, size_t count, uint64_t seed) {
    const int threads = 256;
    const int blocks = int(std::min<size_t>((count + threads - 1) / threads, 65536));
    fill_normal_kernel<<<blocks, threads>>>(data, count, seed);
    CUDA_CHECK_LAUNCH();
}

// Median milliseconds of `call` on the default stream, each call between its own pair of events,
// over about target_seconds of calls (within the repeat bounds) after kWarmupCalls calls.
double median_ms(const std::function<void()>& call, double target_seconds = kTargetSeconds) {
    EventPair probe;
    for (int i = 0; i < kWarmupCalls; ++i) call();
    CUDA_CHECK(cudaEventRecord(probe.start));
    call();
    CUDA_CHECK(cudaEventRecord(probe.stop));
    CUDA_CHECK(cudaEventSynchronize(probe.stop));
    float estimate_ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&estimate_ms, probe.start, probe.stop));

    const int repeats = std::clamp(int(target_seconds * 1e3 / std::max(estimate_ms, 1e-3f)),
                                   kMinRepeats, kMaxRepeats);
    std::vector<EventPair> events(repeats);
    for (auto& pair : events) {
        CUDA_CHECK(cudaEventRecord(pair.start));
        call();
        CUDA_CHECK(cudaEventRecord(pair.stop));
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> times;
    for (auto& pair : events) {
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, pair.start, pair.stop));
        times.push_back(ms);
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    return times[times.size() / 2];
}

// Keeps the GPU busy with `call` for about `seconds` (timed by events, not counted).
void keep_busy(const std::function<void()>& call, double seconds) {
    EventPair span;
    CUDA_CHECK(cudaEventRecord(span.start));
    for (int calls = 0;; ++calls) {
        call();
        if (calls % 4 != 3) continue;
        CUDA_CHECK(cudaEventRecord(span.stop));
        CUDA_CHECK(cudaEventSynchronize(span.stop));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, span.start, span.stop));
        if (ms >= seconds * 1e3) return;
    }
}

// C = A^T B for every shape of kGemmShapes: the transposed-A layout is the one attention's
// S = QK^T uses on row-major data, and one cuBLAS serves at full speed. The ceiling is the best
// rate of any shape (its fastest round's median); the method text lists every shape's rate.
template <class T>
Ceiling measure_gemm(cublasHandle_t handle, cudaDataType_t type, const char* name,
                     const char* type_name) {
    size_t a_elements = 0, b_elements = 0, c_elements = 0;
    for (const GemmShape& shape : kGemmShapes) {
        a_elements = std::max(a_elements, size_t(shape.k) * shape.m);
        b_elements = std::max(b_elements, size_t(shape.k) * shape.n);
        c_elements = std::max(c_elements, size_t(shape.m) * shape.n);
    }
    DeviceBuffer<T> a(a_elements), b(b_elements), c(c_elements);
    fill_normal(a.data(), a_elements, 1);
    fill_normal(b.data(), b_elements, 2);
    const float alpha = 1.0f, beta = 0.0f;
    // CUBLAS_COMPUTE_32F (not _FAST_TF32) under the default math mode: FP32 data stays on the
    // FP32 units, and BF16 data accumulates in FP32 on the tensor cores.
    auto gemm = [&](const GemmShape& shape) {
        CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, shape.m, shape.n, shape.k,
                                  &alpha, a.data(), type, shape.k, b.data(), type, shape.k, &beta,
                                  c.data(), type, shape.m, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
    };
    keep_busy([&] { gemm(kGemmShapes[0]); }, kGemmWarmupSeconds);

    double best_tflops = 0, best_ms = 0;
    std::ostringstream rates;
    for (const GemmShape& shape : kGemmShapes) {
        double shape_ms = 0;
        for (int round = 0; round < kGemmRounds; ++round) {
            const double ms = median_ms([&] { gemm(shape); }, kRoundSeconds);
            shape_ms = round == 0 ? ms : std::min(shape_ms, ms);
        }
        const double tflops = 2.0 * double(shape.m) * shape.n * shape.k / (shape_ms * 1e-3) / 1e12;
        if (tflops > best_tflops) best_tflops = tflops, best_ms = shape_ms;
        rates << (&shape == kGemmShapes ? "" : ", ") << shape.m << "x" << shape.n << "x"
              << shape.k << " " << std::fixed << std::setprecision(1) << tflops;
    }
    std::ostringstream method;
    method << "cublasGemmEx " << type_name << " in and out with CUBLAS_COMPUTE_32F, A transposed; "
           << "best of " << std::size(kGemmShapes) << " shapes (m x n x k TFLOP/s: "
           << rates.str() << "), each the fastest of " << kGemmRounds
           << " medians after " << kGemmWarmupSeconds << " s of warm-up";
    return {name, best_tflops, "TFLOP/s", best_ms, method.str()};
}

// mma.sync.m16n8k16 (BF16 in, FP32 accumulation) issued back to back from registers: the most
// the instruction of stages 05-07 delivers on this GPU, which on Hopper is below what cuBLAS's
// GEMM reaches with wgmma. Each warp keeps kMmaChains independent accumulators in flight, so
// that no mma waits for the previous one; kMmaWarps warps per SM, one block per SM.
constexpr int kMmaWarps = 8;
constexpr int kMmaChains = 16;
constexpr int kMmaIterations = 16384;

__global__ void __launch_bounds__(kMmaWarps * 32) mma_sync_kernel(float* sink, uint32_t seed) {
// Empty when compiled for a GPU without BF16 mma.sync, where measure_mma_sync never launches it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // Operands: bf16 pairs of normal-like magnitude from a hash, different in every lane, so
    // that the tensor cores draw the power real data draws.
    uint32_t a[4], b[2];
    for (int i = 0; i < 6; ++i) {
        const uint64_t bits = splitmix64(seed ^ (uint64_t(threadIdx.x) << 8) ^ uint64_t(i));
        const uint32_t pair = (uint32_t(bits) & 0x807f807fu) | 0x3f003f00u;  // |x| in [0.5, 1)
        if (i < 4) a[i] = pair; else b[i - 4] = pair;
    }
    float acc[kMmaChains][4] = {};
    for (int iteration = 0; iteration < kMmaIterations; ++iteration) {
#pragma unroll
        for (int c = 0; c < kMmaChains; ++c) mma_m16n8k16_bf16(acc[c], a, b[0], b[1]);
    }
    float total = 0.0f;
    for (int c = 0; c < kMmaChains; ++c) total += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
    if (total == 1.0f) sink[0] = total;  // practically never: keeps the mma from being removed
#endif
}

// Null where the GPU has no BF16 mma.sync (before compute capability 8.0).
std::optional<Ceiling> measure_mma_sync() {
    int device = 0, sms = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    if (major < 8) return std::nullopt;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    DeviceBuffer<float> sink(1);
    const double ms = median_ms([&] {
        mma_sync_kernel<<<sms, kMmaWarps * 32>>>(sink.data(), 7);
        CUDA_CHECK_LAUNCH();
    });
    const double flops = 2.0 * 16 * 8 * 16 * double(kMmaChains) * kMmaIterations * kMmaWarps * sms;
    std::ostringstream method;
    method << "mma.sync.m16n8k16 bf16 with FP32 accumulation, back to back from registers: "
           << kMmaWarps << " warps per SM, " << kMmaChains << " independent accumulators each";
    return Ceiling{"bf16_mma_sync", flops / (ms * 1e-3) / 1e12, "TFLOP/s", ms, method.str()};
}

Ceiling measure_copy() {
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    // Source and destination, leaving most of the device free (a small GPU still gets a number).
    const size_t bytes = std::min(kCopyBytes, free_bytes / 4) / 256 * 256;
    DeviceBuffer<float> source(bytes / sizeof(float)), destination(bytes / sizeof(float));
    fill_normal(source.data(), bytes / sizeof(float), 3);
    const double ms = median_ms([&] {
        CUDA_CHECK(cudaMemcpyAsync(destination.data(), source.data(), bytes, cudaMemcpyDeviceToDevice));
    });
    std::ostringstream method;
    method << "cudaMemcpyAsync device to device of " << bytes
           << " bytes; counts bytes read plus bytes written";
    return {"copy", 2.0 * double(bytes) / (ms * 1e-3) / 1e9, "GB/s", ms, method.str()};
}

}  // namespace

const Ceiling* Ceilings::find(const std::string& name) const {
    for (const Ceiling& entry : entries)
        if (entry.name == name) return &entry;
    return nullptr;
}

double Ceilings::gemm_tflops_for(const std::string& dtype) const {
    const Ceiling* entry = find(dtype == "bf16" ? "bf16_gemm" : "fp32_gemm");
    return entry ? entry->value : 0.0;
}

Ceilings measure_ceilings() {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp properties{};
    CUDA_CHECK(cudaGetDeviceProperties(&properties, device));

    cublasHandle_t handle = nullptr;
    CUBLAS_CHECK(cublasCreate(&handle));
    Ceilings ceilings;
    ceilings.gpu = properties.name;
    try {
        CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
        DeviceBuffer<unsigned char> workspace(kCublasWorkspaceBytes);
        CUBLAS_CHECK(cublasSetWorkspace(handle, workspace.data(), kCublasWorkspaceBytes));
        ceilings.entries.push_back(
            measure_gemm<__nv_bfloat16>(handle, CUDA_R_16BF, "bf16_gemm", "bf16"));
        ceilings.entries.push_back(measure_gemm<float>(handle, CUDA_R_32F, "fp32_gemm", "fp32"));
        ceilings.entries.push_back(measure_copy());
        if (auto mma = measure_mma_sync()) ceilings.entries.push_back(*mma);
    } catch (...) {
        cublasDestroy(handle);
        throw;
    }
    cublasDestroy(handle);
    return ceilings;
}

void write_ceilings_csv(std::ostream& out, const Ceilings& ceilings) {
    out << kCeilingsHeader << "\n";
    for (const Ceiling& entry : ceilings.entries) {
        std::ostringstream row;
        row << std::setprecision(6) << csv_field(ceilings.gpu) << "," << csv_field(entry.name)
            << "," << entry.value << "," << csv_field(entry.unit) << "," << entry.median_ms << ","
            << csv_field(entry.method) << "\n";
        out << row.str();
    }
}

Ceilings read_ceilings_csv(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read the ceilings file " + path);
    std::string line;
    if (!std::getline(in, line) ||
        csv_split(line) != csv_split(kCeilingsHeader))
        throw std::runtime_error(path + ": expected the header " + kCeilingsHeader);
    Ceilings ceilings;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        const std::vector<std::string> fields = csv_split(line);
        if (fields.size() != 6) throw std::runtime_error(path + ": malformed row: " + line);
        if (ceilings.gpu.empty()) ceilings.gpu = fields[0];
        ceilings.entries.push_back(
            {fields[1], std::stod(fields[2]), fields[3], std::stod(fields[4]), fields[5]});
    }
    return ceilings;
}

std::string csv_field(const std::string& text) {
    if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
    std::string quoted = "\"";
    for (char c : text) {
        if (c == '"') quoted += '"';
        quoted += c;
    }
    return quoted + "\"";
}

std::vector<std::string> csv_split(const std::string& line) {
    std::vector<std::string> fields(1);
    bool quoted = false;
    for (size_t i = 0; i < line.size(); ++i) {
        const char c = line[i];
        if (quoted) {
            if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
                fields.back() += '"';
                ++i;
            } else if (c == '"') {
                quoted = false;
            } else {
                fields.back() += c;
            }
        } else if (c == '"') {
            quoted = true;
        } else if (c == ',') {
            fields.emplace_back();
        } else if (c != '\r') {
            fields.back() += c;
        }
    }
    return fields;
}
