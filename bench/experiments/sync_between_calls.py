#!/usr/bin/env python3
"""Does a synchronize between two calls of a stage change how long the second one takes?

The first runs of make bench's interleaved schedule (bench/driver.py at b73477c,
docs/profiles/all_stages/bench-slices-h100/) synchronise after every turn of slices. Two
things moved there that no clock explains: stage 11's backward at 1x32x8192² D=128 had a median
of 5.11 ms over calls from 4.56 to 5.60 ms in one run and 4.58 ms in the next, and the cuBLAS
eager baselines at N = 16384 took 1.4-1.8x the time the old back-to-back loop measured. Both
allocate a workspace per call with cudaMallocAsync, from a pool that by default hands its memory
back at every synchronize (release threshold 0).

For each implementation below, times CALLS calls three ways, each call between CUDA events:
  back-to-back   no synchronize between calls (how the old loop ran);
  sync           torch.cuda.synchronize() after every call (how a 1-call slice runs);
  sync+keep      the same, with the device's memory pool told to keep its memory
                 (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = UINT64_MAX through the driver API).
Prints the median, min and max of each. If sync is slower than back-to-back and sync+keep is not,
the pool's release is the cause and the driver should raise the threshold.

usage: python3 bench/experiments/sync_between_calls.py [--calls 20]   (after make all; a GPU)
"""
import argparse
import ctypes
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "common"))
import stage_abi  # noqa: E402

CASES = [  # suite, pass, (batch, heads, len_q, len_kv, head_dim, causal)
    ("11_hopper_backward", "bwd", (1, 32, 8192, 8192, 128, 0)),
    ("07_backward", "bwd", (1, 32, 8192, 8192, 128, 0)),
    ("bench/cublas_bf16", "fwd", (4, 8, 16384, 16384, 64, 0)),
    ("00_naive", "fwd", (8, 12, 4096, 4096, 64, 0)),
    ("10_pingpong", "fwd", (1, 32, 8192, 8192, 128, 0)),  # no workspace: the control
]
RELEASE_THRESHOLD = 4  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD


def set_release_threshold(value):
    cuda = ctypes.CDLL("libcuda.so.1")
    device, pool = ctypes.c_int(), ctypes.c_void_p()
    assert cuda.cuDeviceGet(ctypes.byref(device), torch.cuda.current_device()) == 0
    assert cuda.cuDeviceGetMemPool(ctypes.byref(pool), device) == 0
    threshold = ctypes.c_uint64(value)
    assert cuda.cuMemPoolSetAttribute(pool, RELEASE_THRESHOLD, ctypes.byref(threshold)) == 0
    if value == 0:
        assert cuda.cuMemPoolTrimTo(pool, ctypes.c_size_t(0)) == 0


def make_call(suite, pass_name, fields):
    stage = stage_abi.load(suite)
    dtype = torch.float32 if stage.capabilities.dtype == "fp32" else torch.bfloat16
    shape = stage_abi.Shape(*fields)
    b, h, lq, lk, d, _ = fields
    q = torch.randn(b, h, lq, d, device="cuda", dtype=dtype)
    k = torch.randn(b, h, lk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, h, lk, d, device="cuda", dtype=dtype)
    o, lse = torch.empty_like(q), torch.empty(b, h, lq, device="cuda", dtype=torch.float32)
    stream = torch.cuda.current_stream().cuda_stream
    args = [q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr()]
    stage.forward(*args, shape, stream)
    if pass_name == "fwd":
        return lambda: stage.forward(*args, shape, stream), (q, k, v, o, lse)
    grads = [torch.randn_like(q), torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)]
    pointers = args + [g.data_ptr() for g in grads]
    return lambda: stage.backward(*pointers, shape, stream), (q, k, v, o, lse, grads)


def timed(call, calls, sync):
    times = []
    for _ in range(calls):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        call()
        end.record()
        if sync:
            torch.cuda.synchronize()
        times.append((begin, end))
    torch.cuda.synchronize()
    return [b.elapsed_time(e) for b, e in times]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20)
    arguments = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; "
          f"{arguments.calls} calls each")
    for suite, pass_name, fields in CASES:
        call, keep_alive = make_call(suite, pass_name, fields)
        line = f"{suite} {pass_name} {'x'.join(map(str, fields))}:"
        for mode, sync, threshold in (("back-to-back", False, 0), ("sync", True, 0),
                                      ("sync+keep", True, 2**64 - 1)):
            set_release_threshold(threshold)
            call()
            torch.cuda.synchronize()
            times = timed(call, arguments.calls, sync)
            line += (f"  {mode} median {statistics.median(times):.4g} min {min(times):.4g} "
                     f"max {max(times):.4g} ms;")
        set_release_threshold(0)
        print(line, flush=True)
        del call, keep_alive
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
