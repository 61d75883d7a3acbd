// A Hopper stage's kernel with its phase stamps compiled in (common/timeline.cuh): runs one
// shape, then writes every stamp of the first blocks as CSV, for draw_timeline.py to draw the
// schedule as it happened on the SM. The forward for 08, 09, 10 and 12; the backward for 11
// (TIMELINE_BACKWARD, set by the Makefile), after one forward that gives it O and LSE. Warm-up
// calls first (one, or TIMELINE_WARMUP), so that the measured call finds the code loaded. Not a
// benchmark: the stamps cost a clock read and a store each.
//   make -C bench/experiments timeline       (builds it for 08, 09, 10, 11 and 12)
//   build/experiments/timeline_10_pingpong [B H Lq Lk D causal] > timeline.csv   (an H100)
//   build/experiments/timeline_11_hopper_backward [B H Lq Lk D causal [deterministic]] > timeline_11.csv
// Default shape: the BF16 headline, 1 8 4096 8192 128 0. TIMELINE_FIRST_BLOCK=F in the
// environment stamps blocks F .. F + 3 instead of the first four (a later wave's, say); the CSV
// numbers them 0 .. 3 and its first line says which they are.
#define ATTENTION_TIMELINE
#include "attention.cu"  // the stage's, on the include path (ATTENTION_STAGE_NAME names it)

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "timing.h"

namespace {

// common/timeline.cuh's events, as the CSV names them.
const char* const EVENT_NAMES[] = {"start", "loaded", "tile_ready", "turn", "issued", "s_done",
                                   "softmax_done", "pv_done", "end",
                                   // stage 11's backward
                                   "p_done", "dp_done", "ds_stored", "gradients_turn",
                                   "gradients_issued", "gradients_done", "dq_handed",
                                   // its dQ writer's
                                   "dq_turn", "dq_staged", "dq_read", "dq_released"};
static_assert(sizeof(EVENT_NAMES) / sizeof(EVENT_NAMES[0]) == TIMELINE_EVENTS,
              "a name for every event of common/timeline.cuh");

// Runs the warm-up calls and then the one that is kept, the stamp counts zeroed before each:
// the stamps left are the kept call's (not those of a forward run before it). One warm-up by
// default; TIMELINE_WARMUP=N in the environment runs N back to back (no synchronisation between
// them, the zeroing ordered on the stream), so that the kept call runs at the clocks a loop of
// calls reaches: a single call after an idle GPU runs below them (lab notes 11).
void record_stamps(const std::function<void()>& call) {
    static const int zeros[TIMELINE_BLOCKS][TIMELINE_WARPGROUPS] = {};
    const char* count = std::getenv("TIMELINE_WARMUP");
    const int warmups = count != nullptr && std::atoi(count) > 0 ? std::atoi(count) : 1;
    for (int run = 0; run <= warmups; ++run) {
        CUDA_CHECK(cudaMemcpyToSymbolAsync(timeline_counts, zeros, sizeof(zeros), 0, cudaMemcpyHostToDevice));
        call();
    }
    CUDA_CHECK(cudaDeviceSynchronize());
}

void write_stamps(const char* pass, const AttentionShape& shape, int first_block) {
    std::vector<TimelineStamp> stamps(size_t(TIMELINE_BLOCKS) * TIMELINE_WARPGROUPS *
                                      TIMELINE_STAMPS);
    static int counts[TIMELINE_BLOCKS][TIMELINE_WARPGROUPS];
    CUDA_CHECK(cudaMemcpyFromSymbol(stamps.data(), timeline_records,
                                    stamps.size() * sizeof(TimelineStamp)));
    CUDA_CHECK(cudaMemcpyFromSymbol(counts, timeline_counts, sizeof(counts)));
#ifdef TIMELINE_SPANS
    // Every stamped block's span, not its stamps (timeline_spans_11_hopper_backward): when its
    // first stamp came, its consumers' last, its dQ writer's last and its last, in ns from the
    // earliest first stamp of the grid (the GPU's timer, common to the SMs).
    long long origin = -1;
    for (int block = 0; block < TIMELINE_BLOCKS; ++block)
        for (int slot = 0; slot < TIMELINE_WARPGROUPS; ++slot)
            if (counts[block][slot] > 0) {
                const long long t = stamps[(size_t(block) * TIMELINE_WARPGROUPS + slot) * TIMELINE_STAMPS].nanoseconds;
                origin = origin < 0 ? t : std::min(origin, t);
            }
    std::printf("# %s %s, %s, the span of every block of the first %d that stamped\n", ATTENTION_STAGE_NAME,
                pass, shape.to_string().c_str(), TIMELINE_BLOCKS);
    std::printf("block,start_ns,consumers_end_ns,writer_end_ns,end_ns,overflow\n");
    for (int block = 0; block < TIMELINE_BLOCKS; ++block) {
        long long start = -1, consumers = -1, writer = -1, end = -1;
        bool overflow = false;
        for (int slot = 0; slot < TIMELINE_WARPGROUPS; ++slot) {
            const int count = std::min(counts[block][slot], TIMELINE_STAMPS);
            overflow = overflow || counts[block][slot] > TIMELINE_STAMPS;
            if (count == 0) continue;
            const TimelineStamp* s = &stamps[(size_t(block) * TIMELINE_WARPGROUPS + slot) * TIMELINE_STAMPS];
            const long long first = s[0].nanoseconds - origin, last = s[count - 1].nanoseconds - origin;
            start = start < 0 ? first : std::min(start, first);
            end = std::max(end, last);
            if (slot == TIMELINE_WRITER_SLOT && s[0].event >= TIMELINE_DQ_TURN) writer = last;
            else if (slot > 0) consumers = std::max(consumers, last);
        }
        if (start >= 0)
            std::printf("%d,%lld,%lld,%lld,%lld,%d\n", block, start, consumers, writer, end, int(overflow));
    }
    return;
#endif
    if (first_block == 0)
        std::printf("# %s %s, %s, phase stamps of the first %d blocks\n", ATTENTION_STAGE_NAME, pass,
                    shape.to_string().c_str(), TIMELINE_BLOCKS);
    else
        std::printf("# %s %s, %s, phase stamps of blocks %d to %d (numbered 0 to %d below)\n",
                    ATTENTION_STAGE_NAME, pass, shape.to_string().c_str(), first_block,
                    first_block + TIMELINE_BLOCKS - 1, TIMELINE_BLOCKS - 1);
    std::printf("block,warpgroup,stamp,cycle,nanoseconds,event,tile\n");
    for (int block = 0; block < TIMELINE_BLOCKS; ++block)
        for (int slot = 0; slot < TIMELINE_WARPGROUPS; ++slot) {
            const int count = std::min(counts[block][slot], TIMELINE_STAMPS);
            for (int n = 0; n < count; ++n) {
                const TimelineStamp& s =
                    stamps[(size_t(block) * TIMELINE_WARPGROUPS + slot) * TIMELINE_STAMPS + n];
                // Stage 11's dQ writer (its stamps the only ones in the writer's slot, which
                // the backward's two consumers leave free) is warpgroup -2.
                const bool writer = s.event >= TIMELINE_DQ_TURN;
                std::printf("%d,%d,%d,%lld,%lld,%s,%d\n", block, writer ? -2 : slot - 1, n, s.cycle,
                            s.nanoseconds, EVENT_NAMES[s.event], s.tile);
            }
        }
}

}  // namespace

int main(int argc, char** argv) {
    int v[7] = {1, 8, 4096, 8192, 128, 0, 0};
    if (argc == 7 || argc == 8)
        for (int i = 0; i < argc - 1; ++i) v[i] = std::atoi(argv[i + 1]);
    else if (argc != 1) {
        std::fprintf(stderr, "usage: %s [B H Lq Lk D causal [deterministic]]\n", argv[0]);
        return 2;
    }
    AttentionShape shape = make_shape(v[0], v[1], v[2], v[3], v[4], v[5] != 0);
    shape.deterministic = v[6] != 0;
    const char* first = std::getenv("TIMELINE_FIRST_BLOCK");
    const int first_block = first != nullptr ? std::atoi(first) : 0;
    CUDA_CHECK(cudaMemcpyToSymbol(timeline_first_block, &first_block, sizeof(first_block)));
    DeviceBuffer<bf16> q(size_t(shape.q_elements())), k(size_t(shape.kv_elements())),
        value(size_t(shape.kv_elements())), o(size_t(shape.q_elements()));
    DeviceBuffer<float> lse(size_t(shape.lse_elements()));
    fill_random(q.data(), q.count(), 0, 0);
    fill_random(k.data(), k.count(), q.count(), 0);
    fill_random(value.data(), value.count(), q.count() + k.count(), 0);
    const auto forward = [&] {
        attention_forward(q.data(), k.data(), value.data(), o.data(), lse.data(), shape, 0);
    };
#ifdef TIMELINE_BACKWARD
    forward();  // O and LSE for the backward; its stamps are dropped
    DeviceBuffer<bf16> dout(q.count()), dq(q.count()), dk(k.count()), dv(k.count());
    fill_random(dout.data(), dout.count(), q.count() + 2 * k.count(), 0);
    record_stamps([&] {
        attention_backward(q.data(), k.data(), value.data(), o.data(), lse.data(), dout.data(),
                           dq.data(), dk.data(), dv.data(), shape, 0);
    });
    write_stamps("backward", shape, first_block);
#else
    record_stamps(forward);
    write_stamps("forward", shape, first_block);
#endif
    return 0;
}
