#!/usr/bin/env python3
"""PyTorch baselines for the benchmark, timed the way the C++ driver (common/bench.cpp) times
the stages, and written to the same CSV columns:

  torch_flash, torch_cudnn, torch_efficient, torch_math
      torch.nn.functional.scaled_dot_product_attention restricted to one backend with
      torch.nn.attention.sdpa_kernel;
  torch_eager
      matmul, softmax, matmul, as a model written without a fused kernel runs;
  torch_sdpa
      scaled_dot_product_attention with PyTorch's own choice of backend, as a model calls it;
      FP32 only (seed 003's baseline): in BF16 that choice is one of the fused backends above,
      so those rows would repeat them.

Forward and backward, in FP32 (TF32 off) and BF16. The backward row times the backward alone:
the forward graph is built first and torch.autograd.grad runs over it with retain_graph.

Timing: CUDA events around every call, warm-up, then an adaptive number of timed calls
(about --target-seconds of work, at least 3, at most 50), median and min, rotating over input
sets whose total size exceeds four times the L2 cache. Inputs are randn + 0.5.
FLOPs follow the FlashAttention convention: forward 4*B*H*Lq*Lk*D (halved when causal),
backward 2.5x forward. workspace_bytes is the peak device memory one call allocates beyond
what was allocated before it, less its outputs.

With --ceilings-file (a ceilings.csv written by `bench_<stage> --ceilings`, as `make bench`
passes it), the file also gets PyTorch's own GEMM rate beside cuBLAS's: bf16_torch_matmul and
fp32_torch_matmul (TF32 off), torch.matmul on the shapes common/ceilings.cu uses
(bench/schema.py's GEMM_SHAPES), each the fastest of a few timed rounds after a warm-up, best
shape kept; rows of an earlier measurement are replaced. --no-matmul-ceilings leaves the file alone;
--matmul-ceilings-only measures them and nothing else. `make bench` runs that right after the
cuBLAS ceilings, so that the two rates are taken a few seconds apart with the GPU in the same
state (taken at the two ends of a five-minute run they differed by 3-4%, the same drift two
back-to-back passes of one torch.matmul show on an H100). They are a check on the cuBLAS
ceiling, not what % of SOL is taken against.

Without an importable PyTorch with CUDA, prints why and exits 0 having written nothing.
"""

import argparse
import contextlib
import csv
import gc
import math
import os
import re
import statistics
import subprocess
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from schema import (CEILINGS_COLUMNS, CSV_COLUMNS as CSV_HEADER, FLOP_CONVENTION,  # noqa: E402
                    GEMM_SHAPES, SOL_CEILING, read_sweeps as read_sweep_tuples)
BACKENDS = ["flash", "cudnn", "efficient", "math", "eager", "sdpa"]
# SDPBackend member of each SDPA backend.
SDPA_BACKEND_NAMES = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                      "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
# Backends whose kernels take only 16-bit inputs: an FP32 row is a skip, not an attempt.
HALF_PRECISION_ONLY = {"flash", "cudnn"}
# Backends measured in some element types only; the others get no row (the log says why).
ONLY_IN = {"sdpa": ("fp32", "in bf16 the default dispatch runs one of the fused backends "
                            "measured beside it")}

# torch.matmul ceilings: busy time before the first timed GEMM, then per shape this many rounds
# of about ROUND_SECONDS of calls (at least MIN_ROUND_CALLS); the fastest round's median counts.
MATMUL_WARMUP_SECONDS = 1.0
MATMUL_ROUNDS = 3
MATMUL_ROUND_SECONDS = 0.15
MIN_ROUND_CALLS = 10

# The same timing policy as common/bench.cpp.
DEFAULT_TARGET_SECONDS = 0.25
MIN_REPEATS, MAX_REPEATS = 3, 50
WARMUP_SECONDS, MIN_WARMUP_CALLS, MAX_WARMUP_CALLS = 0.02, 2, 50
SLOW_CALL_SECONDS = 1.0
L2_MULTIPLE = 4
# Rotation target when this PyTorch cannot report the L2 size: beyond any current GPU's L2.
FALLBACK_ROTATION_BYTES = 1 << 30
# Device memory left free when deciding how many input sets fit.
MEMORY_RESERVE_BYTES = 512 << 20
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
        return self.forward_flops() * (2.5 if pass_name == "bwd" else 1.0)


def read_sweeps(path):
    return {name: [Shape(*fields) for fields in shapes]
            for name, shapes in read_sweep_tuples(path).items()}


def read_ceilings(path):
    """(gpu, {ceiling name: value}) from a ceilings CSV written by `bench_<stage> --ceilings`."""
    with open(path, newline="") as ceilings_file:
        rows = list(csv.DictReader(ceilings_file))
    if not rows:
        return "", {}
    return rows[0]["gpu"], {row["ceiling"]: float(row["value"]) for row in rows}


def git_commit():
    try:
        return subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="append", default=[],
                        help="named sweep(s) of the sweeps file, comma-separated; repeatable")
    parser.add_argument("--shape", action="append", default=[],
                        help="one shape B,H,Lq,Lk,D[,causal]; repeatable")
    parser.add_argument("--pass", dest="pass_name", choices=["fwd", "bwd", "all"], default="all")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--csv", help="append one row per (implementation, shape, pass)")
    parser.add_argument("--ceilings-file", help="ceilings CSV for %% of SOL; also gets the "
                        "torch.matmul ceilings unless --no-matmul-ceilings")
    parser.add_argument("--no-matmul-ceilings", action="store_true",
                        help="do not measure torch.matmul into --ceilings-file")
    parser.add_argument("--matmul-ceilings-only", action="store_true",
                        help="measure torch.matmul into --ceilings-file, then exit")
    parser.add_argument("--sweeps-file", default=os.path.join(REPO_ROOT, "bench", "sweeps.txt"))
    parser.add_argument("--commit")
    parser.add_argument("--target-seconds", type=float, default=DEFAULT_TARGET_SECONDS)
    parser.add_argument("--max-seconds-per-shape", type=float, default=0.0,
                        help="cap on timed work per shape (0: none)")
    arguments = parser.parse_args()
    if arguments.matmul_ceilings_only and (not arguments.ceilings_file
                                           or arguments.no_matmul_ceilings):
        parser.error("--matmul-ceilings-only needs --ceilings-file (and no --no-matmul-ceilings)")
    return arguments


def collect_shapes(arguments):
    shapes = []
    for text in arguments.shape:
        values = [int(field) for field in text.split(",")]
        if len(values) not in (5, 6):
            raise SystemExit(f"--shape expects B,H,Lq,Lk,D[,causal], got '{text}'")
        shapes.append(Shape(*(values + [0] * (6 - len(values)))))
    names = [name for group in arguments.sweep for name in group.split(",") if name]
    if names or not shapes:
        sweeps = read_sweeps(arguments.sweeps_file)
        for name in names or ["fp32-headline", "bf16-headline"]:
            if name not in sweeps:
                raise SystemExit(f"no sweep '{name}' in {arguments.sweeps_file}; "
                                 f"known: {' '.join(sorted(sweeps))}")
            shapes.extend(sweeps[name])
    unique = {}
    for shape in shapes:
        unique.setdefault(shape.key(), shape)
    return list(unique.values())


class Skip(Exception):
    """This (implementation, shape, pass) cannot run here; the message says why."""


class Runner:
    def __init__(self, torch, arguments):
        self.torch = torch
        self.arguments = arguments
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.gpu = properties.name
        l2_bytes = getattr(properties, "L2_cache_size", 0)
        self.rotation_bytes = L2_MULTIPLE * l2_bytes if l2_bytes else FALLBACK_ROTATION_BYTES

    # ---- implementations ----------------------------------------------------------------

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

    # ---- buffers ------------------------------------------------------------------------

    def random(self, shape, length, dtype, requires_grad=False):
        tensor = self.torch.randn(shape.batch, shape.heads, length, shape.head_dim,
                                  device="cuda", dtype=dtype) + 0.5
        return tensor.requires_grad_(requires_grad)

    def wanted_sets(self, shape, dtype, pass_name):
        element = self.torch.finfo(dtype).bits // 8
        q_bytes = shape.batch * shape.heads * shape.len_q * shape.head_dim * element
        kv_bytes = shape.batch * shape.heads * shape.len_kv * shape.head_dim * element
        per_set = (2 if pass_name == "fwd" else 4) * (q_bytes + kv_bytes)
        free, _ = self.torch.cuda.mem_get_info()
        fitting = max(1, (free - MEMORY_RESERVE_BYTES) // (2 * per_set))
        return max(1, min(-(-self.rotation_bytes // per_set), fitting))

    def forward_calls(self, attention, shape, dtype):
        sets = []
        for _ in range(self.wanted_sets(shape, dtype, "fwd")):
            sets.append((self.random(shape, shape.len_q, dtype),
                         self.random(shape, shape.len_kv, dtype),
                         self.random(shape, shape.len_kv, dtype)))
        return (lambda index: attention(*sets[index])), len(sets)

    def backward_calls(self, attention, shape, dtype):
        """One forward graph per set, kept for repeated backward calls; adds sets while the
        device keeps room for two more of them."""
        torch = self.torch
        graphs = []
        for _ in range(self.wanted_sets(shape, dtype, "bwd")):
            before = torch.cuda.memory_allocated()
            inputs = (self.random(shape, shape.len_q, dtype, True),
                      self.random(shape, shape.len_kv, dtype, True),
                      self.random(shape, shape.len_kv, dtype, True))
            with torch.enable_grad():
                output = attention(*inputs)
            graphs.append((output, inputs, torch.randn_like(output) + 0.5))
            per_set = torch.cuda.memory_allocated() - before
            free, _ = torch.cuda.mem_get_info()
            if free - MEMORY_RESERVE_BYTES < 2 * per_set:
                break

        def backward(index):
            output, inputs, grad_output = graphs[index]
            return torch.autograd.grad(output, inputs, grad_output, retain_graph=True)
        return backward, len(graphs)

    # ---- timing -------------------------------------------------------------------------

    def time_calls(self, call, sets):
        """(median ms, min ms, timed calls, workspace bytes) of call(set index)."""
        torch = self.torch
        cap_ms = self.arguments.max_seconds_per_shape * 1e3
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        warmup_ms, warmup_calls, workspace = 0.0, 0, 0
        while True:
            if warmup_calls == 0:
                torch.cuda.synchronize()
                allocated_before = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            start.record()
            outputs = call(warmup_calls % sets)
            stop.record()
            stop.synchronize()
            if warmup_calls == 0:
                outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
                output_bytes = sum(t.numel() * t.element_size() for t in outputs)
                workspace = max(0, torch.cuda.max_memory_allocated() - allocated_before
                                - output_bytes)
            del outputs
            last_ms = start.elapsed_time(stop)
            warmup_calls += 1
            # The first call pays one-time costs (cuDNN builds its plan, kernels load): it
            # neither counts towards the warm-up time nor ends the warm-up by being slow, and
            # the repeat count below comes from a later call (as in common/timing.h).
            if warmup_calls == 1:
                continue
            warmup_ms += last_ms
            warm = warmup_calls >= MIN_WARMUP_CALLS and warmup_ms >= WARMUP_SECONDS * 1e3
            slow = last_ms >= SLOW_CALL_SECONDS * 1e3 or (cap_ms > 0 and warmup_ms >= cap_ms)
            if warm or slow or warmup_calls >= MAX_WARMUP_CALLS:
                break

        repeats = round(self.arguments.target_seconds * 1e3 / max(last_ms, 1e-6))
        repeats = min(max(repeats, MIN_REPEATS), MAX_REPEATS)
        if cap_ms > 0 and repeats * last_ms > cap_ms:
            repeats = max(1, int(cap_ms / last_ms))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(repeats)]
        for index, (begin, end) in enumerate(events):
            begin.record()
            call((warmup_calls + index) % sets)
            end.record()
        torch.cuda.synchronize()
        times = [begin.elapsed_time(end) for begin, end in events]
        return statistics.median(times), min(times), repeats, workspace

    # ---- one row ------------------------------------------------------------------------

    def prime(self, backend, dtype):
        """One untimed forward and backward on a small shape, so that one-time costs (library
        handles, kernel loading) do not land in the first shape's warm-up estimate."""
        torch = self.torch
        shape = Shape(1, 1, 128, 128, 64, 0)
        try:
            attention, context = self.attention_function(backend, shape, dtype)
            with warnings.catch_warnings(), context():
                warnings.simplefilter("ignore")
                inputs = [self.random(shape, 128, dtype, True) for _ in range(3)]
                attention(*inputs).sum().backward()
            torch.cuda.synchronize()
        except (Skip, RuntimeError) as error:
            if "CUDA error" in str(error):
                raise

    def measure(self, backend, shape, dtype, pass_name):
        """A result dict, or raises Skip."""
        torch = self.torch
        attention, context = self.attention_function(backend, shape, dtype)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with context():
                    if pass_name == "fwd":
                        with torch.no_grad():
                            call, sets = self.forward_calls(attention, shape, dtype)
                            median_ms, min_ms, calls, workspace = self.time_calls(call, sets)
                    else:
                        call, sets = self.backward_calls(attention, shape, dtype)
                        median_ms, min_ms, calls, workspace = self.time_calls(call, sets)
            except torch.cuda.OutOfMemoryError as error:
                raise Skip("out of device memory: " + first_line(error))
            except RuntimeError as error:
                # A CUDA error (a fault, not a refusal) leaves the context unusable: stop.
                if "CUDA error" in str(error):
                    raise
                raise Skip(refusal_reason(caught) or first_line(error))
        return {"median_ms": median_ms, "min_ms": min_ms, "calls": calls, "sets": sets,
                "workspace_bytes": workspace}


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
    arguments = parse_arguments()
    try:
        import torch
    except ImportError:
        print("baselines.py: PyTorch is not importable; no PyTorch baseline rows written "
              "(install it: pip install torch)")
        return 0
    if not torch.cuda.is_available():
        print("baselines.py: PyTorch sees no CUDA device; no PyTorch baseline rows written")
        return 0

    # FP32 rows must run on the FP32 units, as the FP32 stages and the FP32 ceiling do.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    shapes = [] if arguments.matmul_ceilings_only else collect_shapes(arguments)
    passes = ["fwd", "bwd"] if arguments.pass_name == "all" else [arguments.pass_name]
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    dtype_names = [name for name in arguments.dtypes.split(",") if name]
    backends = [name for name in arguments.backends.split(",") if name]
    for name in dtype_names:
        if name not in dtypes:
            raise SystemExit(f"--dtypes: unknown '{name}' (fp32, bf16)")
    for name in backends:
        if name not in BACKENDS:
            raise SystemExit(f"--backends: unknown '{name}' ({', '.join(BACKENDS)})")

    runner = Runner(torch, arguments)
    commit = arguments.commit or git_commit()
    ceilings = {}
    if arguments.ceilings_file:
        ceiling_gpu, ceilings = read_ceilings(arguments.ceilings_file)
        if ceiling_gpu != runner.gpu:
            print(f"[torch] the ceilings were measured on {ceiling_gpu}, not this "
                  f"{runner.gpu}: no % of SOL, no torch.matmul ceilings")
            ceilings = {}
        elif not arguments.no_matmul_ceilings:
            record_matmul_ceilings(torch, arguments.ceilings_file, runner.gpu)
    if arguments.matmul_ceilings_only:
        return 0
    print(f"[torch] torch {torch.__version__} on {runner.gpu}: {len(backends)} backend(s) x "
          f"{len(dtype_names)} dtype(s) x {len(shapes)} shape(s) x {len(passes)} pass(es)")
    print(f"[torch] {FLOP_CONVENTION}")

    writer, csv_file = None, None
    if arguments.csv:
        new = not os.path.exists(arguments.csv) or os.path.getsize(arguments.csv) == 0
        if not new:
            with open(arguments.csv, newline="") as existing:
                if next(csv.reader(existing), None) != CSV_HEADER:
                    raise SystemExit(f"{arguments.csv} has a different header; "
                                     f"expected: {','.join(CSV_HEADER)}")
        csv_file = open(arguments.csv, "a", newline="")
        writer = csv.writer(csv_file, lineterminator="\n")
        if new:
            writer.writerow(CSV_HEADER)

    pairs = []
    for dtype_name in dtype_names:
        for backend in backends:
            only = ONLY_IN.get(backend)
            if only and dtype_name != only[0]:
                print(f"[torch_{backend} {dtype_name}] not measured: {only[1]}")
            else:
                pairs.append((dtype_name, backend))
    total = len(pairs) * len(shapes) * len(passes)
    index = 0
    for dtype_name, backend in pairs:
        ceiling = ceilings.get(SOL_CEILING[dtype_name], 0.0)
        stage = f"torch_{backend}"
        runner.prime(backend, dtypes[dtype_name])
        for shape in shapes:
            for pass_name in passes:
                index += 1
                prefix = (f"[{stage} {dtype_name}] {index}/{total} {pass_name} "
                          f"{shape.describe()}: ")
                row = {"median_ms": "", "min_ms": "", "tflops": "", "pct_sol": "",
                       "workspace_bytes": "", "status": "ok"}
                try:
                    result = runner.measure(backend, shape, dtypes[dtype_name], pass_name)
                    tflops = shape.flops(pass_name) / (result["median_ms"] * 1e-3) / 1e12
                    row.update(median_ms=f"{result['median_ms']:.6g}",
                               min_ms=f"{result['min_ms']:.6g}", tflops=f"{tflops:.5g}",
                               workspace_bytes=str(result["workspace_bytes"]))
                    message = f"{result['median_ms']:.4g} ms, {tflops:.1f} TFLOP/s"
                    if ceiling:
                        row["pct_sol"] = f"{100 * tflops / ceiling:.4g}"
                        message += f", {100 * tflops / ceiling:.1f}% of SOL"
                    message += (f" (median of {result['calls']}, min "
                                f"{result['min_ms']:.4g} ms, {result['sets']} input set"
                                f"{'s' if result['sets'] > 1 else ''})")
                except Skip as skip:
                    row["status"] = f"skipped: {skip}"
                    message = row["status"]
                    gc.collect()  # the exception's frames may hold this shape's tensors
                torch.cuda.empty_cache()
                print(prefix + message, flush=True)
                if writer:
                    writer.writerow([runner.gpu, stage, dtype_name, shape.batch, shape.heads,
                                     shape.len_q, shape.len_kv, shape.head_dim,
                                     int(shape.causal), pass_name, row["median_ms"],
                                     row["min_ms"], row["tflops"], row["pct_sol"],
                                     row["workspace_bytes"], commit, row["status"]])
                    csv_file.flush()
    if csv_file:
        csv_file.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
