// mma.sync m16n8k16 bf16 throughput against warps per SM and independent accumulators per warp
// (the microbenchmark behind docs/profiles/06_pipelined/variant-pingpong.txt; the benchmark driver's
// bf16_mma_sync ceiling, common/ceilings.cu, is its 8-warp, 16-accumulator case).
// Not built by this folder's Makefile; it needs only the CUDA runtime. From the repository root:
//   nvcc -O3 -arch=sm_90 -o build/mma_sync_throughput bench/experiments/mma_sync_throughput.cu && build/mma_sync_throughput
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
template <int CHAINS>
__global__ void mma_loop(float* out, int iters, uint32_t seed) {
    uint32_t a[4], b[2];
    for (int i = 0; i < 4; ++i) a[i] = seed * (threadIdx.x + i) | 0x3f803f80u;
    b[0] = a[1] ^ 0x10001; b[1] = a[2] ^ 0x20002;
    float acc[CHAINS][4] = {};
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    float s = 0;
    for (int c = 0; c < CHAINS; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
    if (s == 12345.f) out[0] = s;
}
template <int CHAINS>
void run(int warps, int sms) {
    float* out; cudaMalloc(&out, 4);
    const int iters = 4096;
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (int w = 0; w < 2; ++w) mma_loop<CHAINS><<<sms, warps * 32>>>(out, iters, 7);
    cudaEventRecord(e0);
    for (int r = 0; r < 5; ++r) mma_loop<CHAINS><<<sms, warps * 32>>>(out, iters, 7);
    cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1); ms /= 5;
    double flops = 4096.0 * CHAINS * iters * warps * sms;
    printf("warps/SM %2d chains %2d: %.3f ms  %.1f TFLOP/s\n", warps, CHAINS, ms, flops / ms * 1e-9);
    cudaFree(out);
}
int main() {
    int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    int clk; cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
    printf("SMs %d, clock %d kHz\n", sms, clk);
    for (int w : {4, 8, 16}) { run<4>(w, sms); run<8>(w, sms); run<16>(w, sms); }
    return 0;
}
