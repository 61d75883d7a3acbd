// Measured ceilings of the GPU the benchmark runs on: the best rate cuBLAS reaches on a few large
// BF16 and FP32 GEMMs, and what a device-to-device copy reaches through device memory. "% of SOL"
// in the benchmark is taken against these, measured in the same run on the same GPU, rather than
// against a datasheet figure that clocks, power limits and board variants make unreachable.
//
// The ceilings CSV (bench/results/<gpu>/ceilings.csv) has one row per ceiling:
//     gpu,ceiling,value,unit,median_ms,method
// with `ceiling` one of the names below:
//     bf16_gemm   TFLOP/s   cublasGemmEx, BF16 in and out, FP32 accumulation (tensor cores):
//                           the best of three shapes, each the fastest of several rounds
//     fp32_gemm   TFLOP/s   the same in FP32, FP32 compute without TF32 (CUDA cores)
//     copy        GB/s      cudaMemcpyAsync device to device, bytes read plus bytes written
//     bf16_mma_sync TFLOP/s mma.sync.m16n8k16 BF16 (FP32 accumulation) back to back from
//                           registers: the instruction of stages 05-07 without any data movement
// and, appended by bench/baselines.py when PyTorch is importable (bench/schema.py lists them all):
//     bf16_torch_matmul, fp32_torch_matmul   TFLOP/s   torch.matmul on the same shapes, a check
//                           on the cuBLAS rows (never used for % of SOL)
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

// The ceilings CSV's header: written, and checked when read, from this one place.
inline constexpr const char* kCeilingsHeader = "gpu,ceiling,value,unit,median_ms,method";

struct Ceiling {
    std::string name;  // bf16_gemm | fp32_gemm | copy | bf16_mma_sync
    double value = 0;  // in `unit`
    std::string unit;  // TFLOP/s or GB/s
    double median_ms = 0;
    std::string method;  // what was timed, for the reader of the CSV
};

struct Ceilings {
    std::string gpu;  // cudaDeviceProp::name of the GPU they were measured on
    std::vector<Ceiling> entries;

    // The entry called `name`, or null when it was not measured.
    const Ceiling* find(const std::string& name) const;
    // The GEMM ceiling a stage of element type `dtype` ("bf16" or "fp32") is held against,
    // in TFLOP/s; 0 when unknown.
    double gemm_tflops_for(const std::string& dtype) const;
};

// Times the ceilings on the current device (random data, warm-up, median of repeats);
// bf16_mma_sync only from compute capability 8.0 on.
// Throws std::runtime_error on a CUDA or cuBLAS failure.
Ceilings measure_ceilings();

// The CSV described above, header included.
void write_ceilings_csv(std::ostream& out, const Ceilings& ceilings);
// Throws std::runtime_error when the file cannot be read or is not in that format.
Ceilings read_ceilings_csv(const std::string& path);

// Minimal RFC 4180 CSV, shared with the benchmark driver: a field is quoted only when it holds a
// comma, a quote or a line break (skip reasons do).
std::string csv_field(const std::string& text);
std::vector<std::string> csv_split(const std::string& line);
