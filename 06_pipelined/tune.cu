// Times the tilings of stage 06 against each other on the shapes the chapter tunes for, and
// checks that each gives the output of the launcher's choice. Not part of `make`: build with
//   nvcc -std=c++17 -O3 -arch=native -Icommon -DATTENTION_DTYPE_BF16 -DATTENTION_NO_LAUNCHER \
//        -Xptxas -v 06_pipelined/tune.cu common/validate.cpp common/cuda_check.cpp -o build/tune_06
// and run build/tune_06 (`build/tune_06 quick`: only the launcher's tilings). Timing: CUDA
// events, 3 warm-up calls, median of 20; the inputs stay in L2 where they fit (the shared
// benchmark driver is the reference for published numbers).
// FLOPs: 4*B*H*Lq*Lk*D, halved when causal.
#include "attention.cu"

#include <cstdio>
#include <string>
#include <vector>

namespace {

__global__ void fill_random(bf16* data, int64_t count, uint32_t seed) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
         i += int64_t(gridDim.x) * blockDim.x) {
        uint32_t x = uint32_t(i) * 2654435761u ^ seed;
        x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
        data[i] = __float2bfloat16(float(x & 0xffff) / 65536.0f * 3.0f - 1.0f);  // mean 0.5
    }
}

struct Buffers {
    bf16 *q, *k, *v, *o;
    float* lse;
};

template <class Config>
void run_tiling(const char* name, const Buffers& b, const AttentionShape& shape,
                const std::vector<bf16>& reference, int group_heads = 0) {
    if (shape.head_dim != Config::HEAD_DIM) return;
    auto call = [&] { launch<Config>(b.q, b.k, b.v, b.o, b.lse, shape, 0, group_heads); };
    for (int i = 0; i < 3; ++i) call();
    std::vector<float> times;
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < 20; ++i) {
        CUDA_CHECK(cudaEventRecord(start));
        call();
        CUDA_CHECK(cudaEventRecord(stop));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    const double ms = times[times.size() / 2];
    double flops = 4.0 * shape.batch * shape.heads * double(shape.len_q) * shape.len_kv * shape.head_dim;
    if (shape.causal) flops /= 2;
    std::vector<bf16> out(size_t(shape.q_elements()));
    CUDA_CHECK(cudaMemcpy(out.data(), b.o, out.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
    double diff = 0, norm = 0;
    for (size_t i = 0; i < out.size(); ++i) {
        const double x = __bfloat162float(out[i]), y = __bfloat162float(reference[i]);
        diff += (x - y) * (x - y);
        norm += y * y;
    }
    const int groups = group_heads > 0 ? group_heads : heads_per_l2_group(shape);
    std::printf("%-28s heads/group %-4d %-34s %9.3f ms %7.1f TFLOP/s  rel diff to launcher %.2e\n", name, groups,
                shape.to_string().c_str(), ms, flops / ms * 1e-9, std::sqrt(diff / norm));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
}

// SKIP: SKIP_UNCHANGED_RESCALE (1: skip O's rescale where no row max moved; 0: always rescale).
#define TILING_GROUPED(D, W, R, KV, MB, VB, SKIP, GROUP) run_tiling<Tiling<D, W, R, KV, MB, VB, SKIP>>( \
    "Tiling<" #D "," #W "," #R "," #KV "," #MB "," #VB "," #SKIP ">", buffers, shape, reference, GROUP)
#define TILING(D, W, R, KV, MB, VB, SKIP) TILING_GROUPED(D, W, R, KV, MB, VB, SKIP, 0)

}  // namespace

int main(int argc, char** argv) {
    // "quick": only the launcher's tilings, grouped as the launcher groups heads.
    const bool quick = argc > 1 && std::string(argv[1]) == "quick";
    const std::vector<AttentionShape> shapes{
        make_shape(1, 8, 4096, 8192, 128), make_shape(4, 8, 4096, 4096, 64),
        make_shape(16, 16, 4096, 4096, 128, true), make_shape(4, 8, 4096, 4096, 64, true),
        make_shape(16, 16, 4096, 4096, 128)};
    for (const AttentionShape& shape : shapes) {
        Buffers buffers{};
        CUDA_CHECK(cudaMalloc(&buffers.q, shape.q_elements() * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&buffers.k, shape.kv_elements() * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&buffers.v, shape.kv_elements() * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&buffers.o, shape.q_elements() * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&buffers.lse, shape.lse_elements() * sizeof(float)));
        fill_random<<<1024, 256>>>(buffers.q, shape.q_elements(), 1);
        fill_random<<<1024, 256>>>(buffers.k, shape.kv_elements(), 2);
        fill_random<<<1024, 256>>>(buffers.v, shape.kv_elements(), 3);
        std::vector<bf16> reference(size_t(shape.q_elements()));
        if (shape.head_dim == 64) launch<Tiling64>(buffers.q, buffers.k, buffers.v, buffers.o, buffers.lse, shape, 0);
        else launch<Tiling128>(buffers.q, buffers.k, buffers.v, buffers.o, buffers.lse, shape, 0);
        CUDA_CHECK(cudaMemcpy(reference.data(), buffers.o, reference.size() * sizeof(bf16),
                              cudaMemcpyDeviceToHost));
        if (quick) {
            TILING(64, 4, 2, 64, 2, 2, 0);
            TILING(128, 4, 2, 64, 1, 2, 1);
        } else {
            TILING(64, 4, 1, 64, 2, 1, 1);
            TILING(64, 4, 2, 64, 2, 1, 1);
            TILING(64, 4, 2, 64, 2, 2, 1);
            TILING(64, 4, 2, 64, 2, 2, 0);
            TILING(64, 4, 2, 128, 1, 1, 1);
            TILING(128, 4, 2, 32, 1, 1, 1);
            TILING(128, 4, 2, 32, 2, 2, 1);
            TILING(128, 4, 2, 64, 1, 1, 1);
            TILING(128, 4, 2, 64, 1, 2, 1);
            TILING(128, 4, 2, 64, 1, 2, 0);
            TILING(128, 4, 2, 48, 1, 2, 1);
            TILING(128, 4, 2, 48, 1, 2, 0);
            TILING(128, 8, 1, 64, 1, 1, 1);
            TILING(128, 8, 2, 64, 1, 2, 1);
            // The launcher's tilings with every head in one group (the q tile is the slow index
            // of the whole grid) and with one head per group.
            for (int group : {shape.batch * shape.heads, 1}) {
                TILING_GROUPED(64, 4, 2, 64, 2, 2, 0, group);
                TILING_GROUPED(128, 4, 2, 64, 1, 2, 1, group);
            }
        }
        cudaFree(buffers.q); cudaFree(buffers.k); cudaFree(buffers.v); cudaFree(buffers.o);
        cudaFree(buffers.lse);
    }
    return 0;
}
