#!/usr/bin/env python3
"""The PyTorch side of the benchmark: the baselines' calls, which bench/driver.py times beside
the stages, and PyTorch's own GEMM rate beside cuBLAS's ceilings.

  torch_flash, torch_cudnn, torch_efficient, torch_math
      torch.nn.functional.scaled_dot_product_attention restricted to one backend with
      torch.nn.attention.sdpa_kernel;
  torch_eager
      matmul, softmax, matmul, as a model written without a fused kernel runs;
  torch_sdpa
      scaled_dot_product_attention with PyTorch's own choice of backend, as a model calls it
      (bench/driver.py times it in FP32 only: in BF16 that choice is one of the fused backends
      above, so those rows would repeat them).

Run as a script with --ceilings-file (a ceilings.csv written by `bench_<stage> --ceilings`, as
`make bench` passes it), it adds PyTorch's own GEMM rate beside cuBLAS's: bf16_torch_matmul and
fp32_torch_matmul (TF32 off), torch.matmul on the shapes common/ceilings.cu uses
(bench/schema.py's GEMM_SHAPES), each the fastest of a few timed rounds after a warm-up, best
shape kept; rows of an earlier measurement are replaced. `make bench` runs that right after the
cuBLAS ceilings, so that the two rates are taken a few seconds apart with the GPU in the same
state (taken at the two ends of a five-minute run they differed by 3-4%, the same drift two
back-to-back passes of one torch.matmul show on an H100). They are a check on the cuBLAS
ceiling, not what % of SOL is taken against.
"""

import argparse
import contextlib
import csv
import math
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from schema import BACKWARD_PASSES, CEILINGS_COLUMNS, GEMM_SHAPES  # noqa: E402

# SDPBackend member of each SDPA backend.
SDPA_BACKEND_NAMES = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                      "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
# Backends whose kernels take only 16-bit inputs.
HALF_PRECISION_ONLY = {"flash", "cudnn"}

# torch.matmul ceilings: busy time before the first timed GEMM, then per shape this many rounds
# of about ROUND_SECONDS of calls (at least MIN_ROUND_CALLS); the fastest round's median counts.
MATMUL_WARMUP_SECONDS = 1.0
MATMUL_ROUNDS = 3
MATMUL_ROUND_SECONDS = 0.15
MIN_ROUND_CALLS = 10


class Shape:
    def __init__(self, batch, heads, len_q, len_kv, head_dim, causal):
        self.batch, self.heads, self.len_q, self.len_kv = batch, heads, len_q, len_kv
        self.head_dim, self.causal = head_dim, bool(causal)

    def key(self):
        return (self.batch, self.heads, self.len_q, self.len_kv, self.head_dim, self.causal)

    def describe(self):
        return (f"B={self.batch} H={self.heads} Lq={self.len_q} Lk={self.len_kv} "
                f"D={self.head_dim} causal={int(self.causal)}")

    def forward_flops(self):
        flops = 4.0 * self.batch * self.heads * self.len_q * self.len_kv * self.head_dim
        return flops / 2 if self.causal else flops

    def flops(self, pass_name):
        return self.forward_flops() * (2.5 if pass_name in BACKWARD_PASSES else 1.0)


def read_ceilings(path):
    """(gpu, {ceiling name: value}) from a ceilings CSV written by `bench_<stage> --ceilings`."""
    with open(path, newline="") as ceilings_file:
        rows = list(csv.DictReader(ceilings_file))
    if not rows:
        return "", {}
    return rows[0]["gpu"], {row["ceiling"]: float(row["value"]) for row in rows}


class Skip(Exception):
    """This (implementation, shape, pass) cannot run here; the message says why."""


class Runner:
    """Builds the baselines' attention functions."""

    def __init__(self, torch):
        self.torch = torch

    def attention_function(self, backend, shape, dtype):
        """A function (q, k, v) -> o for this backend, and a context manager to run it in."""
        torch = self.torch
        if backend == "eager":
            scale = 1.0 / math.sqrt(shape.head_dim)
            # Built once per shape, as a model would keep it in a buffer.
            hidden = (torch.ones(shape.len_q, shape.len_kv, dtype=torch.bool, device="cuda")
                      .triu(1) if shape.causal else None)

            def eager(q, k, v):
                scores = torch.matmul(q, k.transpose(-2, -1)) * scale
                if hidden is not None:
                    scores = scores.masked_fill(hidden, float("-inf"))
                return torch.matmul(torch.softmax(scores, dim=-1), v)
            return eager, contextlib.nullcontext

        sdpa = torch.nn.functional.scaled_dot_product_attention
        if backend == "sdpa":
            # Whatever backend PyTorch picks for these inputs, as a model that calls SDPA gets.
            return (lambda q, k, v: sdpa(q, k, v, is_causal=shape.causal)), contextlib.nullcontext

        if backend in HALF_PRECISION_ONLY and dtype == torch.float32:
            raise Skip(f"the {backend} SDPA backend takes fp16/bf16 inputs only")
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError:
            raise Skip(f"torch {torch.__version__} has no torch.nn.attention.sdpa_kernel")
        member = getattr(SDPBackend, SDPA_BACKEND_NAMES[backend], None)
        if member is None:
            raise Skip(f"torch {torch.__version__} has no {SDPA_BACKEND_NAMES[backend]} backend")

        def fused(q, k, v):
            # is_causal is top-left aligned, the contract's convention.
            return sdpa(q, k, v, is_causal=shape.causal)
        return fused, lambda: sdpa_kernel([member])


def matmul_ceiling(torch, dtype, name):
    """(TFLOP/s, median ms, method) of torch.matmul over GEMM_SHAPES: the best shape's fastest
    round, as common/ceilings.cu times cuBLAS."""
    largest = [max(shape[i] * shape[j] for shape in GEMM_SHAPES) for i, j in ((0, 2), (2, 1), (0, 1))]
    a_store = torch.randn(largest[0], device="cuda", dtype=dtype)
    b_store = torch.randn(largest[1], device="cuda", dtype=dtype)
    c_store = torch.empty(largest[2], device="cuda", dtype=dtype)

    def operands(m, n, k):
        return (a_store[:m * k].view(m, k), b_store[:k * n].view(k, n),
                c_store[:m * n].view(m, n))

    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    a, b, c = operands(*GEMM_SHAPES[0])
    start.record()
    while True:  # keep the GPU busy until the clocks have settled
        for _ in range(4):
            torch.matmul(a, b, out=c)
        stop.record()
        stop.synchronize()
        if start.elapsed_time(stop) >= MATMUL_WARMUP_SECONDS * 1e3:
            break

    best = (0.0, 0.0)
    rates = []
    for m, n, k in GEMM_SHAPES:
        a, b, c = operands(m, n, k)
        start.record()
        torch.matmul(a, b, out=c)
        stop.record()
        stop.synchronize()
        calls = max(MIN_ROUND_CALLS, round(MATMUL_ROUND_SECONDS * 1e3 / start.elapsed_time(stop)))
        shape_ms = None
        for _ in range(MATMUL_ROUNDS):
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(calls)]
            for begin, end in events:
                begin.record()
                torch.matmul(a, b, out=c)
                end.record()
            torch.cuda.synchronize()
            ms = statistics.median(begin.elapsed_time(end) for begin, end in events)
            shape_ms = ms if shape_ms is None else min(shape_ms, ms)
        tflops = 2.0 * m * n * k / (shape_ms * 1e-3) / 1e12
        rates.append(f"{m}x{n}x{k} {tflops:.1f}")
        best = max(best, (tflops, shape_ms))
    method = (f"torch.matmul {name} in and out{' with TF32 off' if name == 'fp32' else ''} "
              f"(A row-major m x k), torch {torch.__version__}; "
              f"best of {len(GEMM_SHAPES)} shapes (m x n x k TFLOP/s: {', '.join(rates)}), "
              f"each the fastest of {MATMUL_ROUNDS} medians after {MATMUL_WARMUP_SECONDS:g} s "
              "of warm-up")
    return best[0], best[1], method


def record_matmul_ceilings(torch, path, gpu):
    """Rewrites the ceilings CSV at `path` with fresh *_torch_matmul rows."""
    with open(path, newline="") as ceilings_file:
        reader = csv.DictReader(ceilings_file)
        if reader.fieldnames != CEILINGS_COLUMNS:
            raise SystemExit(f"{path}: expected the header {','.join(CEILINGS_COLUMNS)}")
        rows = [row for row in reader if not row["ceiling"].endswith("_torch_matmul")]
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        tflops, ms, method = matmul_ceiling(torch, dtype, name)
        torch.cuda.empty_cache()  # the operands died with matmul_ceiling's frame
        print(f"[torch] ceiling {name}_torch_matmul: {tflops:.1f} TFLOP/s ({method})", flush=True)
        rows.append({"gpu": gpu, "ceiling": f"{name}_torch_matmul", "value": f"{tflops:.6g}",
                     "unit": "TFLOP/s", "median_ms": f"{ms:.6g}", "method": method})
    with open(path, "w", newline="") as ceilings_file:
        writer = csv.DictWriter(ceilings_file, CEILINGS_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def refusal_reason(caught_warnings):
    """SDPA says why a backend refused in warnings before its "No available kernel" error; keep
    the specific ones, without the generic headers and the source locations."""
    reasons = []
    for caught in caught_warnings:
        text = re.sub(r"\s*\(Triggered internally at [^)]*\)\.?", "", str(caught.message)).strip()
        generic = (text.endswith("not used because:") or "runtime disabled" in text
                   or "No available kernel" in text or not text)
        if not generic and text not in reasons:
            reasons.append(text.splitlines()[0][:240])
    return "; ".join(reasons)


def first_line(error):
    text = str(error).strip()
    text = text.splitlines()[0] if text else type(error).__name__
    return text[:240]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ceilings-file", required=True,
                        help="the ceilings CSV to add the torch.matmul rows to")
    arguments = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("baselines.py: PyTorch is not importable; no torch.matmul ceilings "
              "(install it: pip install torch)")
        return 0
    if not torch.cuda.is_available():
        print("baselines.py: PyTorch sees no CUDA device; no torch.matmul ceilings")
        return 0
    # The FP32 rate runs on the FP32 units, as the FP32 stages and the FP32 ceiling do.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    gpu = torch.cuda.get_device_name()
    ceiling_gpu, _ = read_ceilings(arguments.ceilings_file)
    if ceiling_gpu != gpu:
        print(f"[torch] the ceilings were measured on {ceiling_gpu}, not this {gpu}: "
              "no torch.matmul ceilings")
        return 0
    record_matmul_ceilings(torch, arguments.ceilings_file, gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
