// Where a ring call's time goes: stage 13's ring, called back to back, with every kernel, copy
// and memset on every GPU recorded by CUPTI's activity API (the device machines have no Nsight
// Systems), beside the host's start and end of each call on the same clock. ring_trace.py
// sums the records per GPU and per stream: the attention kernels, the merges and copies, NCCL's
// kernels, and the time the compute stream stands idle inside a call.
//
//   make -C bench/experiments ring_trace          (after make -C 13_ring_attention all)
//   NCCL_NVLS_ENABLE=0 build/experiments/ring_trace --gpus 2 --sharding zigzag --len 65536
//       --heads 32 --head-dim 128 --causal 1 --pass fwd --calls 3 --out trace.csv
//
// CSV columns: call (0-based, -1 outside a timed call), device, stream, kind (kernel, memcpy,
// memset; host_call: the call as the host saw it, device -1; runtime, driver: a CUDA API call,
// device -2, stream the host thread), name, start_ns, end_ns.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cupti.h>

#include "attention.h"
#include "cuda_check.h"
#include "ring.h"
#include "timing.h"

namespace {

using bf16 = __nv_bfloat16;

struct Record {
    int device;
    uint32_t stream;
    std::string kind, name;
    uint64_t start, end;
};
std::vector<Record> records;

void cupti_check(CUptiResult result, const char* what) {
    if (result == CUPTI_SUCCESS) return;
    const char* text = nullptr;
    cuptiGetResultString(result, &text);
    throw std::runtime_error(std::string("CUPTI: ") + what + ": " + (text ? text : "?"));
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *size = size_t(16) << 20;
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
            records.push_back({int(k->deviceId), k->streamId, "kernel", k->name ? k->name : "?", k->start, k->end});
        } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
            records.push_back({int(m->deviceId), m->streamId, "memcpy", std::to_string(m->bytes) + " bytes", m->start,
                               m->end});
        } else if (record->kind == CUPTI_ACTIVITY_KIND_RUNTIME || record->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
            // A host API call: device -2, stream = the thread.
            const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
            const char* name = nullptr;
            cuptiGetCallbackName(record->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API
                                                                            : CUPTI_CB_DOMAIN_DRIVER_API,
                                 a->cbid, &name);
            records.push_back({-2, a->threadId, record->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? "runtime" : "driver",
                               name ? name : "?", a->start, a->end});
        } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
            records.push_back({int(m->deviceId), m->streamId, "memset", std::to_string(m->bytes) + " bytes", m->start,
                               m->end});
        }
    }
    std::free(buffer);
}

std::string option(int argc, char** argv, const std::string& flag, const std::string& fallback) {
    for (int i = 1; i + 1 < argc; ++i)
        if (flag == argv[i]) return argv[i + 1];
    return fallback;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const int P = std::stoi(option(argc, argv, "--gpus", "2"));
        const int len = std::stoi(option(argc, argv, "--len", "65536"));
        const int heads = std::stoi(option(argc, argv, "--heads", "32"));
        const int head_dim = std::stoi(option(argc, argv, "--head-dim", "128"));
        const bool causal = std::stoi(option(argc, argv, "--causal", "1")) != 0;
        const int calls = std::stoi(option(argc, argv, "--calls", "3"));
        const std::string pass = option(argc, argv, "--pass", "fwd"), out = option(argc, argv, "--out", "trace.csv");
        const Sharding sharding = parse_sharding(option(argc, argv, "--sharding", "zigzag"));
        if (pass != "fwd" && pass != "bwd") throw std::invalid_argument("--pass fwd|bwd");

        // --keep-pool 1: every GPU's stream-ordered pool keeps what it holds instead of releasing
        // it at each synchronization (the release threshold at its maximum): does the time a
        // call spends before its first kernel come from re-mapping the workspace?
        const bool keep_pool = std::stoi(option(argc, argv, "--keep-pool", "0")) != 0;
        const AttentionShape whole = make_shape(1, heads, len, len, head_dim, causal);
        std::vector<int> gpus(static_cast<size_t>(P));
        for (int r = 0; r < P; ++r) gpus[size_t(r)] = r;
        RingAttention ring(gpus);
        const std::vector<Shard> shards = make_shards(sharding, len, P);
        const int64_t BH = heads;
        const size_t count = static_cast<size_t>(P);
        std::vector<bf16*> q(count), k(count), v(count), o(count), dout(count), dq(count),
            dk(count), dv(count);
        std::vector<float*> lse(count);
        for (int r = 0; r < P; ++r) {
            CUDA_CHECK(cudaSetDevice(r));
            if (keep_pool) {
                cudaMemPool_t pool;
                CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, r));
                uint64_t threshold = UINT64_MAX;
                CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
            }
            const int64_t elements = BH * shards[size_t(r)].length() * head_dim;
            size_t start = 0;  // each tensor from another offset of the benchmark's random pool
            for (bf16** tensor : {&q[size_t(r)], &k[size_t(r)], &v[size_t(r)], &o[size_t(r)], &dout[size_t(r)],
                                  &dq[size_t(r)], &dk[size_t(r)], &dv[size_t(r)]}) {
                CUDA_CHECK(cudaMalloc(tensor, size_t(elements) * sizeof(bf16)));
                fill_random(*tensor, size_t(elements), start + size_t(r) * 7919, 0);
                start += kRandomPoolElements / 9;
            }
            CUDA_CHECK(cudaMalloc(&lse[size_t(r)], size_t(BH * shards[size_t(r)].length()) * sizeof(float)));
            CUDA_CHECK(cudaDeviceSynchronize());
        }
        auto constant = [](const std::vector<bf16*>& list) { return std::vector<const bf16*>(list.begin(), list.end()); };
        auto forward = [&] { ring.forward(constant(q), constant(k), constant(v), o, lse, whole, sharding); };
        auto backward = [&] {
            ring.backward(constant(q), constant(k), constant(v), constant(o),
                          std::vector<const float*>(lse.begin(), lse.end()), constant(dout), dq, dk, dv, whole, sharding);
        };
        forward();
        for (int i = 0; i < 2; ++i) pass == "fwd" ? forward() : backward();  // warm-up

        cupti_check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register");
        for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                        CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER})
            cupti_check(cuptiActivityEnable(kind), "enable");
        std::vector<std::pair<uint64_t, uint64_t>> host;
        for (int i = 0; i < calls; ++i) {
            uint64_t start = 0, end = 0;
            cupti_check(cuptiGetTimestamp(&start), "timestamp");
            pass == "fwd" ? forward() : backward();
            cupti_check(cuptiGetTimestamp(&end), "timestamp");
            host.emplace_back(start, end);
            std::printf("call %d: %.3f ms (host)\n", i, double(end - start) * 1e-6);
        }
        for (int r = 0; r < P; ++r) {
            CUDA_CHECK(cudaSetDevice(r));
            CUDA_CHECK(cudaDeviceSynchronize());
        }
        cupti_check(cuptiActivityFlushAll(1), "flush");

        FILE* file = std::fopen(out.c_str(), "w");
        if (!file) throw std::runtime_error("cannot write " + out);
        std::fprintf(file, "call,device,stream,kind,name,start_ns,end_ns\n");
        for (size_t i = 0; i < host.size(); ++i)
            std::fprintf(file, "%zu,-1,0,host_call,%s,%llu,%llu\n", i, pass.c_str(),
                         (unsigned long long)host[i].first, (unsigned long long)host[i].second);
        for (const Record& record : records) {
            int call = -1;
            for (size_t i = 0; i < host.size(); ++i)
                if (record.start >= host[i].first && record.start <= host[i].second) call = int(i);
            std::string name = record.name;
            std::replace(name.begin(), name.end(), ',', ';');
            std::fprintf(file, "%d,%d,%u,%s,%s,%llu,%llu\n", call, record.device, record.stream, record.kind.c_str(),
                         name.c_str(), (unsigned long long)record.start, (unsigned long long)record.end);
        }
        std::fclose(file);
        std::printf("ring_trace: %zu records -> %s\n", records.size(), out.c_str());
        for (int r = 0; r < P; ++r) {
            CUDA_CHECK(cudaSetDevice(r));
            for (bf16* tensor : {q[size_t(r)], k[size_t(r)], v[size_t(r)], o[size_t(r)], dout[size_t(r)], dq[size_t(r)],
                                 dk[size_t(r)], dv[size_t(r)]})
                cudaFree(tensor);
            cudaFree(lse[size_t(r)]);
        }
    } catch (const std::exception& error) {
        std::fprintf(stderr, "ring_trace: %s\n", error.what());
        return 1;
    }
    return 0;
}
