#!/usr/bin/env python3
"""How long must a timed window be for the SM clock and the power draw to settle?

After the GPU has idled for --idle seconds, runs one attention call back to back for --seconds,
timing every call with CUDA events, while a thread samples the SM clock and the power draw
through NVML every few milliseconds. Prints, per 25 ms slice of the run, the median call time,
the clock and the power; and the time after which every later slice stays within 1% of the
median of the last second. Evidence for docs/benchmarking.md (the warm-up and window lengths).

usage: clock_settle.py [--idle 2] [--seconds 3] > clock-settle.txt   (needs PyTorch, nvidia-ml-py)
"""
import argparse
import statistics
import threading
import time

import pynvml
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def sampler(handle, samples, stop):
    while not stop.is_set():
        clock = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
        power = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        samples.append((time.perf_counter(), clock, power))
        time.sleep(0.002)


def run(name, call, idle, seconds, handle):
    torch.cuda.synchronize()
    time.sleep(idle)
    samples, stop = [], threading.Event()
    thread = threading.Thread(target=sampler, args=(handle, samples, stop))
    thread.start()
    events = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        pair[0].record()
        call()
        pair[1].record()
        events.append(pair)
        if len(events) % 8 == 0:
            events[-8][1].synchronize()  # keep the queue short, so host time tracks GPU time
    torch.cuda.synchronize()
    stop.set()
    thread.join()
    times = [a.elapsed_time(b) for a, b in events]
    # Place each call on the GPU's timeline: cumulative sum of call times from the first start.
    origin = events[0][0]
    offsets = [origin.elapsed_time(a) for a, _ in events]
    slice_ms = 25.0
    slices = {}
    for offset, ms in zip(offsets, times):
        slices.setdefault(int(offset // slice_ms), []).append(ms)
    host0 = samples[0][0] if samples else start
    tail = [ms for offset, ms in zip(offsets, times) if offset >= offsets[-1] - 1000.0]
    reference = statistics.median(tail)
    print(f"== {name}: {len(times)} calls in {offsets[-1] / 1e3:.2f} s after {idle} s idle; "
          f"median of the last second {reference:.4f} ms")
    print("slice_start_ms  calls  median_ms  vs_last_second  sm_clock_mhz  power_w")
    settled_at = None
    for index in sorted(slices):
        values = slices[index]
        med = statistics.median(values)
        t0 = index * slice_ms / 1e3
        window = [s for s in samples if t0 <= s[0] - host0 < t0 + slice_ms / 1e3]
        clock = statistics.median([s[1] for s in window]) if window else float("nan")
        power = statistics.median([s[2] for s in window]) if window else float("nan")
        print(f"{index * slice_ms:14.0f}  {len(values):5d}  {med:9.4f}  {med / reference:14.4f}  "
              f"{clock:12.0f}  {power:7.1f}")
    for index in sorted(slices):
        later = [statistics.median(slices[i]) for i in slices if i >= index]
        if all(abs(v / reference - 1) <= 0.01 for v in later):
            settled_at = index * slice_ms
            break
    print(f"settled (every later 25 ms slice within 1% of the last second) after {settled_at} ms")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--idle", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}")
    shapes = {"cudnn fwd 1x8x4096x8192 D128": (1, 8, 4096, 8192, 128, SDPBackend.CUDNN_ATTENTION),
              "flash fwd 4x8x4096x4096 D64": (4, 8, 4096, 4096, 64, SDPBackend.FLASH_ATTENTION)}
    for name, (b, h, lq, lk, d, backend) in shapes.items():
        q = torch.randn(b, h, lq, d, device="cuda", dtype=torch.bfloat16) + 0.5
        k = torch.randn(b, h, lk, d, device="cuda", dtype=torch.bfloat16) + 0.5
        v = torch.randn(b, h, lk, d, device="cuda", dtype=torch.bfloat16) + 0.5

        def call(q=q, k=k, v=v, backend=backend):
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v)
        call()
        run(name, call, args.idle, args.seconds, handle)


if __name__ == "__main__":
    main()
