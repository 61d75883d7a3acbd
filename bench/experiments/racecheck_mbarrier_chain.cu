// What compute-sanitizer's racecheck makes of shared memory handed from warp to warp through
// mbarriers (the persistent forward's protocols, reduced to three warps). Each kernel is one
// block of 96 threads; run the program under racecheck and read which kernels it names:
//   direct_handover   warp 0 writes, arrives; warp 2 waits on that barrier, writes again
//   chained_handover  warp 0 writes, arrives; warp 1 waits, arrives on a second barrier;
//                     warp 2 waits on that one, writes again (the storer between two consumers)
//   lanes_then_shfl   every lane of warp 0 reads, a __shfl_sync, lane 0 arrives; warp 2 waits,
//                     writes (the work-tile ring read by a whole warp)
//   lane0_then_shfl   the same with only lane 0 reading before it arrives
//   chained_one_thread  thread 0 writes and arrives; thread 32 waits, arrives on a second
//                     barrier; thread 64 waits on that one and writes again
//   one_thread_*      one thread writes a word and arrives, one thread of another warp waits
//                     and writes it again, through: `plain` this header's mbarrier_arrive and
//                     mbarrier_wait; `explicit` the same with .release.cta / .acquire.cta
//                     written out; `test_wait` a loop on mbarrier.test_wait; `cuda_barrier`
//                     libcu++'s cuda::barrier (arrive, then wait on the token)
// Every kernel is race-free by the PTX memory model (mbarrier arrive has release, the completed
// phase's wait acquire semantics, and both are cumulative). Built by:
//   nvcc -std=c++17 -O3 -lineinfo -gencode arch=compute_90a,code=sm_90a -I common \
//        bench/experiments/racecheck_mbarrier_chain.cu -o build/experiments/racecheck_mbarrier_chain
// and run as: compute-sanitizer --tool racecheck build/experiments/racecheck_mbarrier_chain
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

#include <cuda/barrier>

#include "hopper.cuh"

namespace {

constexpr int WORDS = 32;

__device__ void init(uint64_t* bars, int count) {
    if (threadIdx.x == 0) {
        for (int i = 0; i < count; ++i) mbarrier_init(&bars[i], 1);
        fence_barrier_init();
    }
    __syncthreads();
}

__global__ void direct_handover(int* out) {
    __shared__ int data[WORDS];
    __shared__ uint64_t bars[1];
    init(bars, 1);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp == 0) {
        data[lane] = lane;
        __syncwarp();
        if (lane == 0) mbarrier_arrive(&bars[0]);
    } else if (warp == 2) {
        mbarrier_wait(&bars[0], 0);
        data[lane] += 1;
        out[lane] = data[lane];
    }
}

__global__ void chained_handover(int* out) {
    __shared__ int data[WORDS];
    __shared__ uint64_t bars[2];
    init(bars, 2);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp == 0) {
        data[lane] = lane;
        __syncwarp();
        if (lane == 0) mbarrier_arrive(&bars[0]);
    } else if (warp == 1) {
        if (lane == 0) {
            mbarrier_wait(&bars[0], 0);
            mbarrier_arrive(&bars[1]);
        }
    } else {
        mbarrier_wait(&bars[1], 0);
        data[lane] += 1;
        out[lane] = data[lane];
    }
}

__global__ void chained_one_thread(int* out) {
    __shared__ int data[WORDS];
    __shared__ uint64_t bars[2];
    init(bars, 2);
    if (threadIdx.x == 0) {
        data[0] = 1;
        mbarrier_arrive(&bars[0]);
    } else if (threadIdx.x == 32) {
        mbarrier_wait(&bars[0], 0);
        mbarrier_arrive(&bars[1]);
    } else if (threadIdx.x == 64) {
        mbarrier_wait(&bars[1], 0);
        data[0] += 1;
        out[0] = data[0];
    }
}

template <bool ALL_LANES_READ>
__device__ void read_then_shfl(int* out) {
    __shared__ int data[WORDS];
    __shared__ uint64_t bars[1];
    if (threadIdx.x < WORDS) data[threadIdx.x] = int(threadIdx.x);
    init(bars, 1);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp == 0) {
        int value = 0;
        if (ALL_LANES_READ || lane == 0) value = data[0];
        value = __shfl_sync(0xffffffffu, value, 0);
        if (lane == 0) mbarrier_arrive(&bars[0]);
        out[lane] = value;
    } else if (warp == 2) {
        mbarrier_wait(&bars[0], 0);
        if (lane == 0) data[0] = 7;
    }
}
__global__ void lanes_then_shfl(int* out) { read_then_shfl<true>(out); }
__global__ void lane0_then_shfl(int* out) { read_then_shfl<false>(out); }

enum class Sync { plain, explicit_semantics, test_wait };

template <Sync SYNC>
__device__ void arrive(uint64_t* bar) {
    if (SYNC == Sync::explicit_semantics)
        asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
    else
        mbarrier_arrive(bar);
}
template <Sync SYNC>
__device__ void wait(uint64_t* bar) {
    if (SYNC == Sync::plain) {
        mbarrier_wait(bar, 0);
        return;
    }
    uint32_t done = 0;
    while (!done) {
        if (SYNC == Sync::explicit_semantics)
            asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], 0;\n"
                         "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(smem_address(bar)) : "memory");
        else
            asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], 0;\n"
                         "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(smem_address(bar)) : "memory");
    }
}

template <Sync SYNC>
__device__ void one_thread(int* out) {
    __shared__ int data[WORDS];
    __shared__ uint64_t bars[1];
    init(bars, 1);
    if (threadIdx.x == 0) {
        data[0] = 1;
        arrive<SYNC>(&bars[0]);
    } else if (threadIdx.x == 64) {
        wait<SYNC>(&bars[0]);
        data[0] += 1;
        out[0] = data[0];
    }
}
__global__ void one_thread_plain(int* out) { one_thread<Sync::plain>(out); }
__global__ void one_thread_explicit(int* out) { one_thread<Sync::explicit_semantics>(out); }
__global__ void one_thread_test_wait(int* out) { one_thread<Sync::test_wait>(out); }

#pragma nv_diag_suppress static_var_with_dynamic_init
__global__ void one_thread_cuda_barrier(int* out) {
    __shared__ int data[WORDS];
    __shared__ cuda::barrier<cuda::thread_scope_block> bar;
    if (threadIdx.x == 0) init(&bar, 2);
    __syncthreads();
    if (threadIdx.x == 0) {
        data[0] = 1;
        (void)bar.arrive();
    } else if (threadIdx.x == 64) {
        bar.wait(bar.arrive());
        data[0] += 1;
        out[0] = data[0];
    }
}

}  // namespace

int main() {
    int* out = nullptr;
    if (cudaMalloc(&out, WORDS * sizeof(int)) != cudaSuccess) return 1;
    direct_handover<<<1, 96>>>(out);
    chained_handover<<<1, 96>>>(out);
    chained_one_thread<<<1, 96>>>(out);
    lanes_then_shfl<<<1, 96>>>(out);
    lane0_then_shfl<<<1, 96>>>(out);
    one_thread_plain<<<1, 96>>>(out);
    one_thread_explicit<<<1, 96>>>(out);
    one_thread_test_wait<<<1, 96>>>(out);
    one_thread_cuda_barrier<<<1, 96>>>(out);
    const cudaError_t status = cudaDeviceSynchronize();
    std::printf("racecheck_mbarrier_chain: nine kernels ran: %s\n", cudaGetErrorString(status));
    cudaFree(out);
    return status == cudaSuccess ? 0 : 1;
}
