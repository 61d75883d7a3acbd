#!/usr/bin/env python3
"""The benchmark schedule of `make bench`: every stage (through its C ABI library,
common/stage_abi.py), the cuBLAS eager baselines (built as stages) and the PyTorch baselines
(bench/baselines.py), timed in one process by one rule, so that the ratios the course prints
compare numbers taken under the same conditions.

The rule (docs/benchmarking.md says why; bench/experiments/clock_settle.py measured the times):
  * per shape and pass, ROUNDS rounds; each round runs every implementation once, in an order
    rotated by one place per round and reversed every other round, so that no implementation
    always follows the same one;
  * in a round an implementation gets fresh input sets (rotated so that no call finds its inputs
    in L2), WARMUP_SECONDS of untimed calls (at least one; on its first round of a shape also one
    call more that is never counted: plans are built, modules load), then a timed window of
    WINDOW_SECONDS (at least one call), every call between two CUDA events;
  * the round's time is the median of its calls; the row's median_ms is the median over rounds,
    round_min_ms and round_max_ms their spread, min_ms the fastest call of all;
  * the SM clock and the board power (NVML) are read at the end of every timed window; the row
    keeps the medians over its rounds (sm_clock_mhz, power_w);
  * forward rounds of a shape run before its backward rounds, for every implementation.
The stages that carry a copy of another's forward (07 of 06, 11 of 10) are compared with it at
every shape, and the run says whether they agree within AA_TOLERANCE (the A/A check).

FLOPs follow the FlashAttention convention: forward 4*B*H*Lq*Lk*D (halved when causal), backward
2.5x forward. FP32 implementations are timed forward only: no stage has an FP32 backward.

Needs PyTorch with CUDA (tensors, events and the baselines); bench/run_bench.sh checks first.
"""

import argparse
import contextlib
import csv
import gc
import math
import os
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "common"))
import baselines  # noqa: E402
import stage_abi  # noqa: E402
from schema import (CSV_COLUMNS, CSV_EXTRA_COLUMNS, FLOP_CONVENTION, SOL_CEILING,  # noqa: E402
                    read_sweeps)

ROUNDS = 3
WARMUP_SECONDS = 0.03
WINDOW_SECONDS = 0.1
MAX_CALLS = 2000          # a window of calls of a few microseconds stops here
L2_MULTIPLE = 4           # the input sets of one round exceed this many times the L2 size
MEMORY_RESERVE_BYTES = 1 << 30
CACHE_LIMIT_BYTES = 8 << 30  # PyTorch's cached blocks are handed back beyond this
AA_PAIRS = [("11_hopper_backward", "10_pingpong"), ("07_backward", "06_pipelined")]
AA_TOLERANCE = 0.02
# torch_sdpa (PyTorch's own dispatch) in FP32 only: in BF16 it runs one of the fused backends
# measured beside it. flash and cudnn take 16-bit inputs only.
TORCH_BACKENDS = {"bf16": ["flash", "cudnn", "efficient", "math", "eager"],
                  "fp32": ["efficient", "math", "eager", "sdpa"]}


class Skip(Exception):
    """This implementation cannot run this shape and pass here; the message says why."""


# ---- implementations --------------------------------------------------------------------------

class StageImplementation:
    """A stage (or a cuBLAS baseline) called through its library."""

    def select(self, shape):
        pass

    def __init__(self, torch, library):
        self.torch, self.library = torch, library
        caps = library.capabilities
        self.name, self.dtype_name = caps.name, caps.dtype
        self.dtype = torch.float32 if caps.dtype == "fp32" else torch.bfloat16
        self.passes = ["fwd", "bwd"] if caps.backward else ["fwd"]

    def unsupported(self, shape, pass_name, gpu_capability):
        caps = self.library.capabilities
        if caps.compute_capability and caps.compute_capability != gpu_capability:
            return (f"needs a GPU of compute capability {caps.compute_capability / 10:.1f}, "
                    f"this one is {gpu_capability / 10:.1f}")
        if shape.head_dim not in caps.head_dims:
            return (f"head_dim {shape.head_dim} is not supported (supported: "
                    f"{', '.join(map(str, caps.head_dims))})")
        if shape.len_q > caps.max_len_q:
            return f"len_q {shape.len_q} is beyond the stage's limit of {caps.max_len_q}"
        if shape.len_kv > caps.max_len_kv:
            return f"len_kv {shape.len_kv} is beyond the stage's limit of {caps.max_len_kv}"
        if shape.causal and not caps.causal:
            return "causal is not supported"
        return ""

    def round_context(self, pass_name):
        return contextlib.nullcontext()

    def workspace(self, shape, pass_name):
        c_shape = stage_abi.Shape(*shape.key())
        try:
            forward = self.library.workspace_bytes(c_shape)
            if pass_name == "bwd":
                return max(forward, self.library.backward_workspace_bytes(c_shape))
            return forward
        except ValueError as refusal:
            raise Skip(str(refusal))

    def prepare(self, shape, pass_name, sets, make_input):
        """call(set index) for this pass, with everything it reads made first."""
        torch, lib = self.torch, self.library
        c_shape = stage_abi.Shape(*shape.key())
        stream = torch.cuda.current_stream().cuda_stream
        q_shape = (shape.batch, shape.heads, shape.len_q, shape.head_dim)
        lse_shape = (shape.batch, shape.heads, shape.len_q)
        buffers = []
        for _ in range(sets):
            q, k, v = make_input(shape.len_q), make_input(shape.len_kv), make_input(shape.len_kv)
            o = torch.empty(q_shape, device="cuda", dtype=self.dtype)
            lse = torch.empty(lse_shape, device="cuda", dtype=torch.float32)
            entry = {"q": q, "k": k, "v": v, "o": o, "lse": lse}
            if pass_name == "bwd":
                entry.update(dout=make_input(shape.len_q), dq=torch.empty_like(q),
                             dk=torch.empty_like(k), dv=torch.empty_like(v))
            buffers.append(entry)

        def forward(index):
            b = buffers[index]
            lib.forward(b["q"].data_ptr(), b["k"].data_ptr(), b["v"].data_ptr(), b["o"].data_ptr(),
                        b["lse"].data_ptr(), c_shape, stream)

        def backward(index):
            b = buffers[index]
            lib.backward(b["q"].data_ptr(), b["k"].data_ptr(), b["v"].data_ptr(),
                         b["o"].data_ptr(), b["lse"].data_ptr(), b["dout"].data_ptr(),
                         b["dq"].data_ptr(), b["dk"].data_ptr(), b["dv"].data_ptr(), c_shape, stream)

        try:
            if pass_name == "bwd":
                for index in range(sets):  # the backward's O and LSE, from the stage's own forward
                    forward(index)
            return forward if pass_name == "fwd" else backward
        except ValueError as refusal:
            raise Skip(str(refusal))


class TorchImplementation:
    """One PyTorch baseline (bench/baselines.py builds the callables)."""

    def __init__(self, torch, runner, backend, dtype_name):
        self.torch, self.runner, self.backend = torch, runner, backend
        self.name, self.dtype_name = f"torch_{backend}", dtype_name
        self.dtype = torch.float32 if dtype_name == "fp32" else torch.bfloat16
        self.passes = ["fwd"] if dtype_name == "fp32" else ["fwd", "bwd"]

    def unsupported(self, shape, pass_name, gpu_capability):
        return ""

    def workspace(self, shape, pass_name):
        return None  # measured on the first call

    def round_context(self, pass_name):
        """The backend's sdpa_kernel context (and no_grad for the forward), entered once per
        round rather than once per call."""
        stack = contextlib.ExitStack()
        if pass_name == "fwd":
            stack.enter_context(self.torch.no_grad())
        stack.enter_context(self.context())
        return stack

    def select(self, shape):
        """The backend's attention function for this shape, and its context; or Skip."""
        try:
            self.attention, self.context = self.runner.attention_function(self.backend, shape,
                                                                          self.dtype)
        except baselines.Skip as skip:
            raise Skip(str(skip))

    def prepare(self, shape, pass_name, sets, make_input):
        torch, attention = self.torch, self.attention
        if pass_name == "fwd":
            inputs = [(make_input(shape.len_q), make_input(shape.len_kv), make_input(shape.len_kv))
                      for _ in range(sets)]

            def forward(index):
                return attention(*inputs[index])
            return forward
        graphs = []
        with torch.enable_grad():
            for _ in range(sets):
                inputs = tuple(make_input(length).requires_grad_(True)
                               for length in (shape.len_q, shape.len_kv, shape.len_kv))
                output = attention(*inputs)
                graphs.append((output, inputs, make_input(shape.len_q)))

        def backward(index):
            output, inputs, grad_output = graphs[index]
            return torch.autograd.grad(output, inputs, grad_output, retain_graph=True)
        return backward


# ---- timing -----------------------------------------------------------------------------------

class Clocks:
    """The SM clock (MHz) and board power (W) through NVML, or nothing where it is missing."""

    def __init__(self, device_index):
        self.handle, self.why_not = None, ""
        try:
            import pynvml
            pynvml.nvmlInit()
            self.pynvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception as error:  # ImportError, or NVML missing from the driver
            self.why_not = f"no NVML ({type(error).__name__}: {error}); pip install nvidia-ml-py"

    def read(self):
        if self.handle is None:
            return None, None
        try:
            clock = self.pynvml.nvmlDeviceGetClockInfo(self.handle, self.pynvml.NVML_CLOCK_SM)
            power = self.pynvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
            return clock, power
        except Exception:
            return None, None


def time_round(torch, call, sets, first_round):
    """(median ms, min ms, timed calls) of one round: warm-up, then the timed window."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    index = 0
    if first_round:  # one-time costs (plans, module loading): never counted
        call(index)
        index += 1
        torch.cuda.synchronize()
    warm_ms, last_ms = 0.0, 0.0
    while warm_ms < WARMUP_SECONDS * 1e3 or index == int(first_round):
        start.record()
        call(index % sets)
        stop.record()
        stop.synchronize()
        last_ms = start.elapsed_time(stop)
        warm_ms += last_ms
        index += 1
    calls = max(1, min(MAX_CALLS, math.ceil(WINDOW_SECONDS * 1e3 / max(last_ms, 1e-3))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(calls)]
    for number, (begin, end) in enumerate(events):
        begin.record()
        call((index + number) % sets)
        end.record()
    torch.cuda.synchronize()
    times = [begin.elapsed_time(end) for begin, end in events]
    return statistics.median(times), min(times), calls


# ---- the run ----------------------------------------------------------------------------------

class Shape(baselines.Shape):
    def tag(self):
        return "x".join(str(v) for v in self.key()[:5]) + f"x{int(self.causal)}"


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--describe", action="store_true",
                        help="print the method in one line (for system.txt) and exit")
    parser.add_argument("--stages",
                        help="comma-separated suite folders (00_naive,...,bench/cublas_bf16)")
    parser.add_argument("--sweep", default="fp32-headline,bf16-headline,seqlen,extra")
    parser.add_argument("--csv", help="results CSV to write (replaced)")
    parser.add_argument("--ceilings-file", help="ceilings CSV for %% of SOL")
    parser.add_argument("--aa-file", help="where to write the A/A check's table")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--no-torch-baselines", action="store_true")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    arguments = parser.parse_args()
    if not arguments.describe and not (arguments.stages and arguments.csv):
        parser.error("--stages and --csv are needed")
    return arguments


def method(rounds):
    return (f"rounds (bench/driver.py): {rounds} rounds per shape and pass, each implementation "
            f"{WARMUP_SECONDS:g} s of warm-up and a {WINDOW_SECONDS:g} s timed window per round, "
            f"the order rotated by one place and reversed every other round; median over rounds")


def main():
    arguments = parse_arguments()
    if arguments.describe:
        print(method(arguments.rounds))
        return 0
    try:
        import torch
    except ImportError:
        print("driver.py: PyTorch is not importable (pip install torch)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("driver.py: PyTorch sees no CUDA device", file=sys.stderr)
        return 2
    # FP32 rows run on the FP32 units, as the FP32 stages and the FP32 ceiling do.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = torch.cuda.current_device()
    properties = torch.cuda.get_device_properties(device)
    gpu = properties.name
    gpu_capability = properties.major * 10 + properties.minor
    rotation_bytes = L2_MULTIPLE * (getattr(properties, "L2_cache_size", 0) or (256 << 20))
    clocks = Clocks(device)

    implementations = []
    for suite in [s for s in arguments.stages.split(",") if s]:
        implementations.append(StageImplementation(torch, stage_abi.load(suite)))
    if not arguments.no_torch_baselines:
        # Only its attention_function is used here; the timing arguments are its own loop's.
        runner = baselines.Runner(torch, argparse.Namespace(target_seconds=WINDOW_SECONDS,
                                                            max_seconds_per_shape=0.0))
        for dtype_name in ("fp32", "bf16"):
            for backend in TORCH_BACKENDS[dtype_name]:
                implementations.append(TorchImplementation(torch, runner, backend, dtype_name))

    ceilings = {}
    if arguments.ceilings_file:
        ceiling_gpu, ceilings = baselines.read_ceilings(arguments.ceilings_file)
        if ceiling_gpu != gpu:
            print(f"the ceilings were measured on {ceiling_gpu}, not {gpu}: no % of SOL")
            ceilings = {}

    sweeps = read_sweeps()
    shapes, seen = [], set()
    for name in [n for n in arguments.sweep.split(",") if n]:
        if name not in sweeps:
            raise SystemExit(f"no sweep '{name}' in bench/sweeps.txt; known: "
                             f"{' '.join(sorted(sweeps))}")
        for fields in sweeps[name]:
            if fields not in seen:
                seen.add(fields)
                shapes.append(Shape(*fields))

    print(f"{gpu}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
          f"{len(implementations)} implementations x {len(shapes)} shapes; "
          f"{method(arguments.rounds)}", flush=True)
    print(FLOP_CONVENTION, flush=True)
    if clocks.why_not:
        print(f"clocks and power not recorded: {clocks.why_not}", flush=True)

    out = open(arguments.csv, "w", newline="")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS + CSV_EXTRA_COLUMNS)
    results = {}
    started = time.time()
    steps = [(shape, pass_name) for shape in shapes for pass_name in ("fwd", "bwd")]
    for step, (shape, pass_name) in enumerate(steps, 1):
        active, skipped = [], []
        for impl in implementations:
            if pass_name not in impl.passes:
                continue
            reason = impl.unsupported(shape, pass_name, gpu_capability)
            (skipped if reason else active).append((impl, reason))
        state = {impl.name + "/" + impl.dtype_name: {"rounds": [], "min": math.inf, "calls": 0,
                                                       "clock": [], "power": [], "skip": "",
                                                       "workspace": None}
                 for impl, _ in active}
        for round_index in range(arguments.rounds):
            # Rotated by one place per round, and reversed every other round, so that no
            # implementation always runs right after the same one (11 after 10, say).
            shift = round_index % max(1, len(active))
            order = active[shift:] + active[:shift]
            for impl, _ in (order[::-1] if round_index % 2 else order):
                entry = state[impl.name + "/" + impl.dtype_name]
                if entry["skip"]:
                    continue
                try:
                    measure(torch, impl, shape, pass_name, entry, round_index == 0,
                            rotation_bytes, clocks)
                except Skip as skip:
                    entry["skip"] = str(skip)
                    gc.collect()  # the exception's frames may hold this shape's tensors
                    torch.cuda.empty_cache()
                if torch.cuda.memory_reserved() > CACHE_LIMIT_BYTES:
                    torch.cuda.empty_cache()
        summary = []
        for impl, reason in skipped:
            write_row(writer, gpu, impl, shape, pass_name, None, reason, arguments.commit, ceilings)
        for impl, _ in active:
            key = impl.name + "/" + impl.dtype_name
            entry = state[key]
            if entry["skip"] or not entry["rounds"]:
                write_row(writer, gpu, impl, shape, pass_name, None, entry["skip"] or "not run",
                          arguments.commit, ceilings)
                continue
            row = write_row(writer, gpu, impl, shape, pass_name, entry, "", arguments.commit,
                            ceilings)
            results[(impl.name, impl.dtype_name, shape.key(), pass_name)] = row
            summary.append(f"{impl.name}/{impl.dtype_name} {row['median_ms']:.4g}")
        out.flush()
        elapsed = time.time() - started
        print(f"[{step}/{len(steps)}, {elapsed / 60:.1f} min] {pass_name} {shape.describe()}: "
              + "; ".join(summary) + (f" ({len(skipped)} skipped)" if skipped else ""), flush=True)
    out.close()
    return aa_check(results, shapes, arguments.aa_file)


def measure(torch, impl, shape, pass_name, entry, first_round, rotation_bytes, clocks):
    """One round of one implementation: adds to `entry`, or raises Skip."""
    element = 4 if impl.dtype_name == "fp32" else 2
    q_bytes = shape.batch * shape.heads * shape.len_q * shape.head_dim * element
    kv_bytes = shape.batch * shape.heads * shape.len_kv * shape.head_dim * element
    per_set = (2 * q_bytes + 2 * kv_bytes) * (2 if pass_name == "bwd" else 1)
    workspace = impl.workspace(shape, pass_name)
    free, _ = torch.cuda.mem_get_info()
    usable = free - MEMORY_RESERVE_BYTES - (workspace or 0)
    if usable < per_set:
        raise Skip(f"not enough device memory: needs {per_set / 2**30:.2f} GiB of buffers + "
                   f"{(workspace or 0) / 2**30:.2f} GiB of workspace, {free / 2**30:.2f} GiB free")
    sets = max(1, min(-(-rotation_bytes // per_set), int(usable // (2 * per_set)) or 1))

    def make_input(length):
        return torch.randn(shape.batch, shape.heads, length, shape.head_dim, device="cuda",
                           dtype=impl.dtype) + 0.5

    if workspace:
        torch.cuda.empty_cache()  # the stage allocates its workspace itself, outside PyTorch's cache
    impl.select(shape)
    with warnings.catch_warnings(record=True) as caught, impl.round_context(pass_name):
        warnings.simplefilter("always")
        try:
            call = impl.prepare(shape, pass_name, sets, make_input)
            if first_round and workspace is None:
                # The peak one call allocates beyond its inputs, less its outputs.
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                outputs = call(0)
                torch.cuda.synchronize()
                outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
                output_bytes = sum(t.numel() * t.element_size() for t in outputs
                                   if hasattr(t, "numel"))
                entry["workspace"] = max(0, torch.cuda.max_memory_allocated() - base - output_bytes)
                del outputs
            elif workspace is not None:
                entry["workspace"] = workspace
            median_ms, min_ms, calls = time_round(torch, call, sets, first_round)
        except torch.cuda.OutOfMemoryError as error:
            raise Skip("out of device memory: " + baselines.first_line(error))
        except ValueError as refusal:  # a stage's launcher refused the shape
            raise Skip(str(refusal))
        except RuntimeError as error:
            if "CUDA error" in str(error) or isinstance(impl, StageImplementation):
                raise  # a fault, not a refusal: the context may be unusable
            raise Skip(baselines.refusal_reason(caught) or baselines.first_line(error))
    clock, power = clocks.read()
    entry["rounds"].append(median_ms)
    entry["min"] = min(entry["min"], min_ms)
    entry["calls"] += calls
    if clock is not None:
        entry["clock"].append(clock)
        entry["power"].append(power)


def write_row(writer, gpu, impl, shape, pass_name, entry, skip, commit, ceilings):
    flops = shape.flops(pass_name)
    common = [gpu, impl.name, impl.dtype_name, shape.batch, shape.heads, shape.len_q, shape.len_kv,
              shape.head_dim, int(shape.causal), pass_name]
    if entry is None:
        workspace = ""
        writer.writerow(common + ["", "", "", "", workspace, commit, f"skipped: {skip}",
                                  "", "", "", "", "", ""])
        return None
    median_ms = statistics.median(entry["rounds"])
    tflops = flops / (median_ms * 1e-3) / 1e12
    ceiling = ceilings.get(SOL_CEILING[impl.dtype_name], 0.0)
    pct = f"{100 * tflops / ceiling:.4g}" if ceiling else ""
    clock = f"{statistics.median(entry['clock']):.0f}" if entry["clock"] else ""
    power = f"{statistics.median(entry['power']):.0f}" if entry["power"] else ""
    workspace = "" if entry["workspace"] is None else str(entry["workspace"])
    writer.writerow(common + [f"{median_ms:.6g}", f"{entry['min']:.6g}", f"{tflops:.5g}", pct,
                              workspace, commit, "ok", len(entry["rounds"]),
                              f"{min(entry['rounds']):.6g}", f"{max(entry['rounds']):.6g}",
                              entry["calls"], clock, power])
    return {"median_ms": median_ms, "round_min_ms": min(entry["rounds"]),
            "round_max_ms": max(entry["rounds"])}


def aa_check(results, shapes, path):
    """The stages that carry another's forward against it, at every shape where both ran."""
    lines = [f"A/A check: each stage's copy of another's forward against it, forward time ratio "
             f"per shape (|ratio - 1| <= {AA_TOLERANCE:.0%} agrees)"]
    verdicts = []
    for copy, original in AA_PAIRS:
        ratios = []
        for shape in shapes:
            a = results.get((copy, "bf16", shape.key(), "fwd"))
            b = results.get((original, "bf16", shape.key(), "fwd"))
            if a and b:
                ratios.append((shape.tag(), a["median_ms"] / b["median_ms"]))
        if not ratios:
            lines.append(f"{copy} / {original}: no shape where both ran")
            continue
        worst = max(ratios, key=lambda item: abs(item[1] - 1))
        outside = [tag for tag, ratio in ratios if abs(ratio - 1) > AA_TOLERANCE]
        agree = not outside
        verdicts.append(agree)
        lines.append(f"{copy} / {original}: {len(ratios)} shapes, ratios "
                     f"{min(r for _, r in ratios):.3f} to {max(r for _, r in ratios):.3f} "
                     f"(median {statistics.median(r for _, r in ratios):.3f}), worst {worst[0]} "
                     f"{worst[1]:.3f}: {'agree' if agree else 'DISAGREE at ' + ', '.join(outside)}")
        for tag, ratio in ratios:
            lines.append(f"  {tag:24s} {ratio:.4f}")
    text = "\n".join(lines)
    print(text, flush=True)
    if path:
        with open(path, "w") as aa_file:
            aa_file.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
