// The ring's benchmark: one shape over P GPUs in, one CSV row per pass out, beside the ring's own
// kernels alone (stage 12's forward, stage 11's backward) timed in the same run on the same GPUs.
// First run on 2 H200s: lab notes 13.
//
//   bench_13_ring_attention --gpus 4 --sharding zigzag --heads 32 --len 262144 --head-dim 128
//                           --causal 1 [--batch 1] [--pass fwd|bwd|both] [--repeats 5]
//                           [--baseline-len 65536] [--max-piece 65536 (0: runs never cut)]
//   bench_13_ring_attention --print-header      the CSV's header line alone
//
// How it times (time_rounds): after a warm-up call of each, --repeats rounds of the ring's call,
// the baseline, the ring's call again and the baseline again, so that every ring call follows a
// baseline and every baseline a ring call. The ring's call is synchronous on the host (every
// GPU's thread joins), so it is timed by the host clock from its start to the last GPU's end:
// what a training step waits for; median_ms and min_ms are of its first call in each round,
// aa_median_ms the median of its second, the A/A check (bench/ring_table.py prints their ratio).
// The baseline (struct Baseline) is the kernel of the pass alone (stage 12's forward through
// fastest_forward, stage 11's backward) on every GPU of the ring at once, each on its
// own inputs, timed with CUDA events on each GPU; its time is the slowest GPU's. Loading every
// GPU as the ring does gives the baseline the ring's clocks and power: timed on GPU 0 alone, and
// right after a ring call, it read 2-5% faster than between calls (lab notes 13, calls AB4 and
// EG). Its shape is the ring's batch, heads, head dim and mask at --baseline-len (default: the
// ring's tokens per GPU, N / P, capped at 131072 so that one call stays under a few seconds).
// Per GPU, a ring step is one such square (contiguous sharding) or pieces of it: a kernel's
// rate changes with the length (its backward about 3% faster at 65536 tokens than at 131072 on
// an H100), so a baseline of another length would move the efficiency by that much (lab notes
// 13; the runs before this default used min(N, 131072)).
// The backward row times the ring's backward alone (the forward that makes its O and LSE runs
// once before). Inputs are random, on each GPU, never zeros.
// FLOPs follow the FlashAttention convention: forward 4*B*H*N*N*D (halved when causal),
// backward 2.5x forward. Per-GPU TFLOP/s = FLOPs / P / median time; efficiency = that over
// the baseline's TFLOP/s. (Until the ring took stage 12's forward, the forward's baseline was
// stage 11's forward, stage 10's kernel: bench/results and lab notes 13 say which run had which.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "attention.h"
#include "cuda_check.h"
#include "harness.h"
#include "ring.h"

namespace {

using bf16 = __nv_bfloat16;

struct Options {
    int gpus = 2, batch = 1, heads = 32, len = 65536, head_dim = 128, repeats = 5, baseline_len = 0;
    int max_piece = int(kRingMaxPiece);
    bool causal = true;
    std::string sharding = "zigzag", pass = "both";
};

[[noreturn]] void usage(const std::string& problem) {
    std::fprintf(stderr,
                 "bench_13_ring_attention: %s\nusage: bench_13_ring_attention --gpus P --sharding "
                 "contiguous|zigzag|striped --len N [--batch B] [--heads H] [--head-dim 64|128] [--causal 0|1] "
                 "[--pass fwd|bwd|both] [--repeats R] [--baseline-len L] [--max-piece M]; or --print-header\n",
                 problem.c_str());
    std::exit(2);
}

Options parse(int argc, char** argv) {
    Options options;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (flag == "--print-header") {
            std::printf("gpu,gpus,sharding,batch,heads,len,head_dim,causal,pass,median_ms,min_ms,tflops_per_gpu,"
                        "baseline_len,baseline_ms,baseline_tflops,efficiency,aa_median_ms,nccl,status\n");
            std::exit(0);
        }
        if (i + 1 >= argc) usage(flag + " needs a value");
        const std::string value = argv[++i];
        auto number = [&] {
            try {
                return std::stoi(value);
            } catch (...) {
                usage(flag + " " + value + ": not a number");
            }
        };
        if (flag == "--gpus") options.gpus = number();
        else if (flag == "--batch") options.batch = number();
        else if (flag == "--heads") options.heads = number();
        else if (flag == "--len") options.len = number();
        else if (flag == "--head-dim") options.head_dim = number();
        else if (flag == "--causal") options.causal = number() != 0;
        else if (flag == "--repeats") options.repeats = std::max(1, number());
        else if (flag == "--baseline-len") options.baseline_len = number();
        else if (flag == "--max-piece") options.max_piece = number();
        else if (flag == "--sharding") options.sharding = value;
        else if (flag == "--pass") options.pass = value;
        else usage("unknown flag " + flag);
    }
    if (options.pass != "fwd" && options.pass != "bwd" && options.pass != "both") usage("--pass " + options.pass);
    return options;
}

// Uniform in [-0.5, 1.5) from a hash of the index: mean 0.5, never zeros, no host traffic.
__global__ void fill_random_kernel(bf16* data, int64_t count, uint64_t seed) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
        uint64_t x = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
        x ^= x >> 31;
        x *= 0xBF58476D1CE4E5B9ull;
        x ^= x >> 29;
        data[i] = __float2bfloat16_rn(float(x >> 40) / float(1 << 24) * 2.0f - 0.5f);
    }
}

template <class T>
T* device_alloc(size_t count) {
    void* pointer = nullptr;
    if (count) CUDA_CHECK(cudaMalloc(&pointer, count * sizeof(T)));
    return static_cast<T*>(pointer);
}

void fill_random(bf16* data, int64_t count, uint64_t seed) {
    if (count == 0) return;
    fill_random_kernel<<<unsigned(std::min<int64_t>((count + 255) / 256, 1 << 16)), 256>>>(data, count, seed);
    CUDA_CHECK_LAUNCH();
}

struct Timings {
    std::vector<double> ring, baseline, again;  // per round, ms
};

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
}
double least(const std::vector<double>& values) { return *std::min_element(values.begin(), values.end()); }

// The benchmark's method: after one warm-up call of each, `rounds` rounds of the ring's call,
// the baseline's, the ring's again and the baseline's again, so that the ring and its baseline
// meet the same clocks and temperatures, each after the other, and the ring's second call, timed
// the same way as its first, is the A/A check: two copies of one call, whose medians must agree.
// The ring's call is synchronous on the host (every GPU's thread joins) and timed by the host
// clock, from its start to the last GPU's end, as a training step waits for it; `baseline_ms`
// times its own call and returns the milliseconds (Baseline::time: CUDA events on every GPU).
template <class Ring, class BaselineMs>
Timings time_rounds(Ring ring, BaselineMs baseline_ms, int rounds) {
    auto host_ms = [&] {
        const auto start = std::chrono::steady_clock::now();
        ring();
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    };
    host_ms();
    baseline_ms();
    Timings timings;
    for (int i = 0; i < rounds; ++i) {  // every ring call follows a baseline, every baseline a ring call
        timings.ring.push_back(host_ms());
        timings.baseline.push_back(baseline_ms());
        timings.again.push_back(host_ms());
        timings.baseline.push_back(baseline_ms());
    }
    return timings;
}

// The ring's kernels alone on every GPU of the ring at once, each on its own copy of the baseline shape: the
// GPUs loaded as the ring loads them, so that the baseline meets the ring's clocks and power. Its
// time is the slowest GPU's, by CUDA events on each.
struct Baseline {
    struct Gpu {
        DeviceBuffer<bf16> q, k, v, o, dout, dq, dk, dv;
        DeviceBuffer<float> lse;
        std::unique_ptr<EventPair> events;
    };
    std::vector<Gpu> gpus;
    AttentionShape shape;

    Baseline(int count, const AttentionShape& base, bool backward) : gpus(size_t(count)), shape(base) {
        for (int r = 0; r < count; ++r) {
            CUDA_CHECK(cudaSetDevice(r));
            Gpu& g = gpus[size_t(r)];
            g.q = DeviceBuffer<bf16>(size_t(base.q_elements()));
            g.k = DeviceBuffer<bf16>(size_t(base.kv_elements()));
            g.v = DeviceBuffer<bf16>(size_t(base.kv_elements()));
            g.o = DeviceBuffer<bf16>(size_t(base.q_elements()));
            g.dout = DeviceBuffer<bf16>(size_t(base.q_elements()));
            g.lse = DeviceBuffer<float>(size_t(base.lse_elements()));
            if (backward) {
                g.dq = DeviceBuffer<bf16>(size_t(base.q_elements()));
                g.dk = DeviceBuffer<bf16>(size_t(base.kv_elements()));
                g.dv = DeviceBuffer<bf16>(size_t(base.kv_elements()));
            }
            fill_random(g.q.data(), base.q_elements(), 101 + 10 * uint64_t(r));
            fill_random(g.k.data(), base.kv_elements(), 102 + 10 * uint64_t(r));
            fill_random(g.v.data(), base.kv_elements(), 103 + 10 * uint64_t(r));
            fill_random(g.dout.data(), base.q_elements(), 104 + 10 * uint64_t(r));
            g.events = std::make_unique<EventPair>();
            fastest_forward(g.q.data(), g.k.data(), g.v.data(), g.o.data(), g.lse.data(), shape);
            CUDA_CHECK(cudaDeviceSynchronize());
        }
    }
    // One call on every GPU at once; the slowest GPU's milliseconds.
    double time(bool forward) {
        for (size_t r = 0; r < gpus.size(); ++r) {
            CUDA_CHECK(cudaSetDevice(int(r)));
            Gpu& g = gpus[r];
            CUDA_CHECK(cudaEventRecord(g.events->start));
            if (forward)
                fastest_forward(g.q.data(), g.k.data(), g.v.data(), g.o.data(), g.lse.data(), shape);
            else
                attention_backward(g.q.data(), g.k.data(), g.v.data(), g.o.data(), g.lse.data(), g.dout.data(),
                                   g.dq.data(), g.dk.data(), g.dv.data(), shape);
            CUDA_CHECK(cudaEventRecord(g.events->stop));
        }
        double slowest = 0;
        for (size_t r = 0; r < gpus.size(); ++r) {
            CUDA_CHECK(cudaSetDevice(int(r)));
            CUDA_CHECK(cudaEventSynchronize(gpus[r].events->stop));
            slowest = std::max(slowest, gpus[r].events->milliseconds());
        }
        return slowest;
    }
};

}  // namespace

int main(int argc, char** argv) {
    const Options options = parse(argc, argv);
    try {
        const Sharding sharding = parse_sharding(options.sharding);
        const AttentionShape whole = make_shape(options.batch, options.heads, options.len, options.len,
                                                options.head_dim, options.causal);
        const int P = options.gpus;
        std::vector<int> gpus(static_cast<size_t>(P));
        for (int r = 0; r < P; ++r) gpus[size_t(r)] = r;
        RingAttention ring(gpus);
        cudaDeviceProp properties{};
        CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));

        const int64_t BH = int64_t(whole.batch) * whole.heads, D = whole.head_dim;
        const std::vector<Shard> shards = make_shards(sharding, whole.len_q, P, options.max_piece);
        std::vector<bf16*> q(static_cast<size_t>(P)), k(static_cast<size_t>(P)), v(static_cast<size_t>(P)), o(static_cast<size_t>(P)), dout(static_cast<size_t>(P)), dq(static_cast<size_t>(P)),
            dk(static_cast<size_t>(P)), dv(static_cast<size_t>(P));
        std::vector<float*> lse(static_cast<size_t>(P));
        for (int r = 0; r < P; ++r) {
            CUDA_CHECK(cudaSetDevice(r));
            const int64_t elements = BH * shards[size_t(r)].length() * D;
            for (bf16** tensor : {&q[size_t(r)], &k[size_t(r)], &v[size_t(r)], &o[size_t(r)], &dout[size_t(r)]})
                *tensor = device_alloc<bf16>(static_cast<size_t>(elements));
            if (options.pass != "fwd")
                for (bf16** tensor : {&dq[size_t(r)], &dk[size_t(r)], &dv[size_t(r)]})
                    *tensor = device_alloc<bf16>(static_cast<size_t>(elements));
            lse[size_t(r)] = device_alloc<float>(size_t(BH * shards[size_t(r)].length()));
            fill_random(q[size_t(r)], elements, 1 + 10 * uint64_t(r));
            fill_random(k[size_t(r)], elements, 2 + 10 * uint64_t(r));
            fill_random(v[size_t(r)], elements, 3 + 10 * uint64_t(r));
            fill_random(dout[size_t(r)], elements, 4 + 10 * uint64_t(r));
            CUDA_CHECK(cudaDeviceSynchronize());
        }
        auto constant = [](const std::vector<bf16*>& list) { return std::vector<const bf16*>(list.begin(), list.end()); };
        auto forward = [&] {
            ring.forward(constant(q), constant(k), constant(v), o, lse, whole, sharding, options.max_piece);
        };
        auto backward = [&] {
            ring.backward(constant(q), constant(k), constant(v), constant(o),
                          std::vector<const float*>(lse.begin(), lse.end()), constant(dout), dq, dk, dv, whole, sharding,
                          options.max_piece);
        };

        // The ring's kernels alone at the baseline length on every GPU of the ring at once (Baseline).
        const int base_len = options.baseline_len > 0 ? options.baseline_len : std::max(1, std::min(options.len / P, 131072));
        const AttentionShape base = make_shape(options.batch, options.heads, base_len, base_len, options.head_dim,
                                               options.causal);
        Baseline baseline(P, base, options.pass != "fwd");

        for (const std::string pass : {"fwd", "bwd"}) {
            if (options.pass != "both" && options.pass != pass) continue;
            const bool is_forward = pass == "fwd";
            if (!is_forward) forward();
            auto baseline_ms = [&] { return baseline.time(is_forward); };
            const Timings timings = is_forward ? time_rounds(forward, baseline_ms, options.repeats)
                                               : time_rounds(backward, baseline_ms, options.repeats);
            const std::pair<double, double> ring_ms{median(timings.ring), least(timings.ring)};
            const std::pair<double, double> base_ms{median(timings.baseline), least(timings.baseline)};
            const double flops = is_forward ? forward_flops(whole) : backward_flops(whole);
            const double base_flops = is_forward ? forward_flops(base) : backward_flops(base);
            const double per_gpu = flops / P / (ring_ms.first * 1e-3) / 1e12;
            const double base_tflops = base_flops / (base_ms.first * 1e-3) / 1e12;
            std::printf("%s,%d,%s,%d,%d,%d,%d,%d,%s,%.4f,%.4f,%.2f,%d,%.4f,%.2f,%.4f,%.4f,%s,ok\n", properties.name,
                        P, sharding_name(sharding), whole.batch, whole.heads, whole.len_q, whole.head_dim,
                        int(whole.causal), pass.c_str(), ring_ms.first, ring_ms.second, per_gpu, base_len,
                        base_ms.first, base_tflops, per_gpu / base_tflops, median(timings.again),
                        ring_nccl_version().c_str());
            std::fflush(stdout);
        }
        for (int r = 0; r < P; ++r) {
            CUDA_CHECK(cudaSetDevice(r));
            for (bf16* tensor : {q[size_t(r)], k[size_t(r)], v[size_t(r)], o[size_t(r)], dout[size_t(r)],
                                 dq[size_t(r)], dk[size_t(r)], dv[size_t(r)]})
                if (tensor) cudaFree(tensor);
            cudaFree(lse[size_t(r)]);
        }
    } catch (const std::exception& error) {
        // One row that says why (too large for the GPUs' memory, say), then a failing status.
        std::string why = error.what();
        std::replace(why.begin(), why.end(), ',', ';');
        std::printf("-,%d,%s,%d,%d,%d,%d,%d,%s,,,,,,,,,,skipped: %s\n", options.gpus, options.sharding.c_str(),
                    options.batch, options.heads, options.len, options.head_dim, int(options.causal),
                    options.pass.c_str(), why.c_str());
        return 1;
    }
    return 0;
}
