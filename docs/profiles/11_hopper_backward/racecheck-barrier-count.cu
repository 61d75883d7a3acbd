// What compute-sanitizer's racecheck takes as ordering a shared-memory exchange between two
// warpgroups, checked on the H100 (racecheck-barrier-count.txt beside this file). Issue 32:
// racecheck reported hazards in stage 11's exact-D exchange although `bar.sync 3, 256` sits
// between every write and read of it; the only difference from a clean kernel was that the two
// consumers had passed different numbers of barriers (consumer 0 skipped hand_over_dq's two
// barriers on its first tile).
//
// Block of 384 threads: warps 0-3 exit at once (as a producer that has issued its loads), the two
// warpgroups of threads 128..383 exchange one float per thread through a double buffer, each
// round: write, an exchange barrier, read the other warpgroup's value.
//   equal       bar.sync 3, 256 between write and read                      -> 0 hazards expected
//   unequal     the same, but warpgroup 0 also takes two private barriers
//               (bar.sync 1, 128) per round, warpgroup 1 none                -> racecheck: hazards
//   balanced    both take two private barriers per round (stage 11's fix)    -> 0 hazards
//   arrive      the write ordered before the read by bar.arrive (writer) and
//               bar.sync (reader) on one id, as stage 10's and 11's turns    -> racecheck: hazards
//   mbarrier    the exchange barrier is an mbarrier (each warp arrives once,
//               every thread waits on the phase)                              -> racecheck: hazards
// Every mode is correct: in each, the hardware orders every read after the write it reads and
// every write after the reads of the round two before. The program checks the values it read.
//
// build: nvcc -gencode arch=compute_90a,code=sm_90a -O3 -lineinfo racecheck-barrier-count.cu -o rc
// run:   for m in equal unequal balanced arrive mbarrier; do compute-sanitizer --tool racecheck ./rc $m; done
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

__device__ __forceinline__ void bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ uint32_t smem(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem(bar)), "r"(count));
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
    asm volatile("{ .reg .b64 state; mbarrier.arrive.shared::cta.b64 state, [%0]; }" ::"r"(smem(bar)) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, int parity) {
    asm volatile("{ .reg .pred done; WAIT: mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1; @!done bra WAIT; }"
                 ::"r"(smem(bar)), "r"(parity) : "memory");
}

enum Mode { EQUAL, UNEQUAL, BALANCED, ARRIVE, MBARRIER };
constexpr int ROUNDS = 16;

__global__ void exchange(int mode, int* wrong) {
    __shared__ float buffer[2][256];
    __shared__ uint64_t round_done[2];
    if (threadIdx.x == 0) {
        mbarrier_init(&round_done[0], 8);
        mbarrier_init(&round_done[1], 8);
    }
    __syncthreads();
    if (threadIdx.x < 128) return;
    const int c = int(threadIdx.x) - 128;  // 0..255
    const int group = c / 128;
    for (int round = 0; round < ROUNDS; ++round) {
        float* slots = buffer[round % 2];
        float seen;
        if (mode == ARRIVE) {
            // Group 0 writes and arrives on barrier 4; group 1 waits there and reads. Then the other way
            // round on barrier 5.
            if (group == 0) {
                slots[c] = float(round * 1000 + c);
                bar_arrive(4, 256);
                bar_sync(5, 256);
                seen = slots[c + 128];
            } else {
                bar_sync(4, 256);
                seen = slots[c - 128];
                slots[c] = float(round * 1000 + c);
                bar_arrive(5, 256);
            }
        } else {
            if ((mode == UNEQUAL && group == 0) || mode == BALANCED) {
                bar_sync(1 + group, 128);
                bar_sync(1 + group, 128);
            }
            slots[c] = float(round * 1000 + c);
            if (mode == MBARRIER) {
                __syncwarp();
                if (c % 32 == 0) mbarrier_arrive(&round_done[round % 2]);
                mbarrier_wait(&round_done[round % 2], (round / 2) % 2);
            } else {
                bar_sync(3, 256);
            }
            seen = slots[(c + 128) % 256];
        }
        if (seen != float(round * 1000 + (c + 128) % 256)) atomicAdd(wrong, 1);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const char* names[] = {"equal", "unequal", "balanced", "arrive", "mbarrier"};
    int mode = -1;
    for (int m = 0; m < 5; ++m)
        if (argc > 1 && std::strcmp(argv[1], names[m]) == 0) mode = m;
    if (mode < 0) {
        std::fprintf(stderr, "usage: %s equal|unequal|balanced|arrive|mbarrier\n", argv[0]);
        return 2;
    }
    int* wrong = nullptr;
    cudaMalloc(&wrong, sizeof(int));
    cudaMemset(wrong, 0, sizeof(int));
    exchange<<<4, 384>>>(mode, wrong);
    int host_wrong = -1;
    const cudaError_t status = cudaMemcpy(&host_wrong, wrong, sizeof(int), cudaMemcpyDeviceToHost);
    std::printf("%s: %s, %d wrong values\n", names[mode], cudaGetErrorString(status), host_wrong);
    return status == cudaSuccess && host_wrong == 0 ? 0 : 1;
}
