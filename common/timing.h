// The one timing loop (the benchmark driver and the programs in bench/experiments use it) and
// the one way device inputs are filled with random values. Header-only, so that a program
// built on the harness needs no extra object. Tests never time anything.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_check.h"
#include "element.h"
#include "harness.h"

struct Timing {
    double median_ms = 0;
    double min_ms = 0;
    int calls = 0;
};

inline double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    const size_t middle = values.size() / 2;
    return values.size() % 2 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

// Warm-up calls first (clocks ramp up, code caches fill), then about target_seconds of timed
// calls (at least 3, at most 50; fewer only when max_seconds > 0 would be exceeded), each
// between two CUDA events: their median and min. call(set) runs one call on input set `set`
// of `sets`, rotated so that one set's buffers are not still in L2 from the call before. It
// may throw (a launcher refusing its input), which only its first call can do.
inline Timing time_calls(const std::function<void(int)>& call, int sets, cudaStream_t stream,
                         double target_seconds, double max_seconds = 0) {
    constexpr int kMinRepeats = 3, kMaxRepeats = 50;
    constexpr double kWarmupSeconds = 0.02;
    constexpr int kMinWarmupCalls = 2, kMaxWarmupCalls = 50;
    constexpr double kSlowCallSeconds = 1.0;  // one more warm-up call is enough when a call is this long
    const double cap_ms = max_seconds * 1e3;
    EventPair warmup;
    double warmup_total_ms = 0, last_ms = 0;
    int warmup_calls = 0;
    for (;;) {
        CUDA_CHECK(cudaEventRecord(warmup.start, stream));
        call(warmup_calls % sets);
        CUDA_CHECK(cudaEventRecord(warmup.stop, stream));
        CUDA_CHECK(cudaEventSynchronize(warmup.stop));
        last_ms = warmup.milliseconds();
        // The first call pays one-time costs (the module loads, a library builds its plan): it
        // neither counts towards the warm-up time nor ends the warm-up by being slow, and the
        // repeat count below comes from a later call. bench/baselines.py follows the same rule.
        if (++warmup_calls == 1) continue;
        warmup_total_ms += last_ms;
        const bool warm =
            warmup_calls >= kMinWarmupCalls && warmup_total_ms >= kWarmupSeconds * 1e3;
        const bool slow =
            last_ms >= kSlowCallSeconds * 1e3 || (cap_ms > 0 && warmup_total_ms >= cap_ms);
        if (warm || slow || warmup_calls >= kMaxWarmupCalls) break;
    }

    int repeats = std::clamp(int(std::lround(target_seconds * 1e3 / std::max(last_ms, 1e-6))),
                             kMinRepeats, kMaxRepeats);
    if (cap_ms > 0 && repeats * last_ms > cap_ms) repeats = std::max(1, int(cap_ms / last_ms));

    std::vector<EventPair> events(repeats);
    for (int r = 0; r < repeats; ++r) {
        CUDA_CHECK(cudaEventRecord(events[r].start, stream));
        call((warmup_calls + r) % sets);
        CUDA_CHECK(cudaEventRecord(events[r].stop, stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<double> times;
    for (const EventPair& pair : events) times.push_back(pair.milliseconds());
    return {median(times), *std::min_element(times.begin(), times.end()), repeats};
}

// Device inputs are tiled from one device pool of random_inputs (randn + 0.5, rounded to the
// element type), each tensor from a different starting offset: generating randn on the host
// for gigabytes of inputs would cost more time than the benchmark itself.
constexpr size_t kRandomPoolElements = size_t(1) << 22;
constexpr uint64_t kRandomSeed = 2024;

template <class T>
const T* random_pool() {
    static DeviceBuffer<T> pool = [] {
        DeviceBuffer<T> buffer(kRandomPoolElements);
        buffer.upload(from_float<T>(random_inputs(kRandomPoolElements, kRandomSeed)));
        // The copies out of the pool may run on a non-blocking stream that does not wait for
        // the upload on the default stream.
        CUDA_CHECK(cudaDeviceSynchronize());
        return buffer;
    }();
    return pool.data();
}

template <class T>
void fill_random(T* destination, size_t count, size_t start, cudaStream_t stream) {
    const T* pool = random_pool<T>();
    for (size_t done = 0; done < count;) {
        const size_t offset = (start + done) % kRandomPoolElements;
        const size_t chunk = std::min(count - done, kRandomPoolElements - offset);
        CUDA_CHECK(cudaMemcpyAsync(destination + done, pool + offset, chunk * sizeof(T),
                                   cudaMemcpyDeviceToDevice, stream));
        done += chunk;
    }
}
