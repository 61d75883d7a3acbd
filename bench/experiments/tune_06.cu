// Times stage 06's tilings against each other on the shapes its chapter tunes for, and checks
// that each gives the output of the launcher's choice (relative L2 difference). Not a test:
// tests never time. Build and run on a GPU with
//   make -C bench/experiments tune_06 && build/experiments/tune_06 [quick]
// ("quick": only the launcher's tilings). Timing: the harness's time_calls (common/timing.h),
// median of its timed calls; one input set, so inputs stay in L2 where they fit (the benchmark
// driver, which rotates sets, is the reference for published numbers).
// FLOPs: 4*B*H*Lq*Lk*D, halved when causal (the FlashAttention convention).
#include "attention.cu"  // 06_pipelined's, on the include path: its tilings and launch<>

#include <cstdio>
#include <string>
#include <vector>

#include "timing.h"

namespace {

struct Buffers {
    DeviceBuffer<bf16> q, k, v, o;
    DeviceBuffer<float> lse;
};

template <class Config>
void run_tiling(const char* name, Buffers& b, const AttentionShape& shape,
                const std::vector<float>& reference, int group_heads = 0) {
    if (shape.head_dim != Config::HEAD_DIM) return;
    auto call = [&](int) {
        launch<Config>(b.q.data(), b.k.data(), b.v.data(), b.o.data(), b.lse.data(), shape, 0,
                       group_heads);
    };
    const Timing timing = time_calls(call, 1, 0, 0.25);
    const ErrorStats difference = compare(to_float(b.o.download()), reference);
    const int groups = group_heads > 0 ? group_heads : heads_per_l2_group(shape);
    std::printf("%-32s heads/group %-4d %-34s %9.3f ms %7.1f TFLOP/s  rel diff to launcher %.2e\n",
                name, groups, shape.to_string().c_str(), timing.median_ms,
                forward_flops(shape) / timing.median_ms * 1e-9, difference.relative_l2);
}

// SKIP: SKIP_UNCHANGED_RESCALE (1: skip O's rescale where no running max moved; 0: always).
#define TILING_GROUPED(D, W, R, KV, MB, SKIP, GROUP)                                         \
    run_tiling<Tiling<D, W, R, KV, MB, SKIP>>("Tiling<" #D "," #W "," #R "," #KV "," #MB "," \
                                              #SKIP ">", buffers, shape, reference, GROUP)
#define TILING(D, W, R, KV, MB, SKIP) TILING_GROUPED(D, W, R, KV, MB, SKIP, 0)

}  // namespace

int main(int argc, char** argv) {
    const bool quick = argc > 1 && std::string(argv[1]) == "quick";
    const std::vector<AttentionShape> shapes{
        make_shape(1, 8, 4096, 8192, 128), make_shape(4, 8, 4096, 4096, 64),
        make_shape(16, 16, 4096, 4096, 128, true), make_shape(4, 8, 4096, 4096, 64, true),
        make_shape(16, 16, 4096, 4096, 128)};
    for (const AttentionShape& shape : shapes) {
        Buffers buffers{DeviceBuffer<bf16>(size_t(shape.q_elements())),
                        DeviceBuffer<bf16>(size_t(shape.kv_elements())),
                        DeviceBuffer<bf16>(size_t(shape.kv_elements())),
                        DeviceBuffer<bf16>(size_t(shape.q_elements())),
                        DeviceBuffer<float>(size_t(shape.lse_elements()))};
        fill_random(buffers.q.data(), buffers.q.count(), 0, 0);
        fill_random(buffers.k.data(), buffers.k.count(), kRandomPoolElements / 5, 0);
        fill_random(buffers.v.data(), buffers.v.count(), 2 * kRandomPoolElements / 5, 0);
        attention_forward(buffers.q.data(), buffers.k.data(), buffers.v.data(), buffers.o.data(),
                          buffers.lse.data(), shape);
        const std::vector<float> reference = to_float(buffers.o.download());
        if (quick) {
            TILING(64, 4, 2, 64, 2, 0);
            TILING(128, 4, 2, 64, 1, 1);
            continue;
        }
        TILING(64, 4, 1, 64, 2, 1);
        TILING(64, 4, 2, 64, 2, 1);
        TILING(64, 4, 2, 64, 2, 0);
        TILING(64, 4, 2, 128, 1, 1);
        TILING(128, 4, 2, 32, 2, 1);
        TILING(128, 4, 2, 64, 1, 1);
        TILING(128, 4, 2, 64, 1, 0);
        TILING(128, 4, 2, 48, 1, 1);
        TILING(128, 4, 2, 48, 1, 0);
        TILING(128, 8, 1, 64, 1, 1);
        TILING(128, 8, 2, 64, 1, 1);
        // The launcher's tilings with every head in one group (the q tile is the slow index of
        // the whole grid) and with one head per group.
        for (int group : {shape.batch * shape.heads, 1}) {
            TILING_GROUPED(64, 4, 2, 64, 2, 0, group);
            TILING_GROUPED(128, 4, 2, 64, 1, 1, group);
        }
    }
    return 0;
}
