#!/usr/bin/env python3
"""The benchmark schedule of `make bench`: every stage (through its C ABI library,
common/stage_abi.py), the cuBLAS eager baselines (built as stages) and the PyTorch baselines
(bench/baselines.py), timed in one process by one rule, so that the ratios the course prints
compare numbers taken under the same conditions.

The rule (docs/benchmarking.md says why; bench/experiments/clock_settle.py measured the clocks):
  * per shape and pass, every implementation is made resident (its input sets made, rotated so
    that no call finds its inputs in L2) and called twice untimed (the first call pays the
    one-time costs: plans built, modules loaded);
  * the implementations of one element type are timed as one group, BF16's first, and an
    implementation beyond HEAVY_BYTES alone after them (below): a ratio compares implementations
    of one type, and FP32 calls in BF16 turns would hold the H100 below its power limit;
  * then the group's implementations take turns, the order rotated by one place per turn and
    reversed every other turn. Each turn gives every implementation SLICE_SECONDS of credit, and it
    issues the calls its credit covers (round(credit / call): none when a call is much longer
    than its credit, which it keeps for the next turn), so that over the turns every member
    issues about the same time of calls while a turn stays short against the clock's swings; a
    call's length is read from the median of its timed calls once there are five. They go on
    until each has
    TIMED_SECONDS of timed calls (POWER_TIMED_SECONDS for calls of POWER_CALL_MS or more) and
    MIN_CALLS calls (or MAX_TIMED_SECONDS, or MAX_CALLS; a call of LONG_CALL_MS or more stops at
    LONG_MIN_CALLS calls or LONG_MAX_TIMED_SECONDS), where the window is the group's: the
    longest window of its members of calls below LONG_CALL_MS, so that members on either side of
    POWER_CALL_MS stop together; the members the course's ratios compare (the stages, cuDNN and
    FlashAttention-2: compared_in_ratios) also wait for every one of them to have MIN_CALLS
    calls, so that none goes on alone, at another clock, for its count.
    An H100 under load swings its clock by several percent every 100-200 ms: slices much
    shorter than that, spread over seconds, give every implementation the same mix of fast and
    slow moments, so a ratio of two of them does not depend on which moments each one got;
  * every call is timed between two CUDA events. A call shorter than Python's cost of issuing
    it would leave the GPU waiting between calls and the events would time the host, so the
    slices of such an implementation go in behind a GPU sleep (torch.cuda._sleep) longer than
    issuing them takes: the GPU runs their calls back to back;
  * the stages' workspace pool keeps its memory while a group is timed (MemoryPool), as it
    would in a program that calls a stage in a loop, and is trimmed after the group;
  * implementations whose memory would crowd the others out (a workspace or PyTorch
    intermediates beyond HEAVY_BYTES: the materialised score matrix of 00_naive, the cuBLAS
    baselines, PyTorch's math and eager paths at long sequences) take their slices alone, right
    after the others, by the same rule;
  * the row's median_ms is the median of all its timed calls, min_ms the fastest; slices is
    the number of its slices, slice_min_ms and slice_max_ms the spread of the slice medians;
    sm_clock_mhz and power_w the medians of NVML's readings after each turn of slices;
  * forward slices of a shape run before its backward slices, for every implementation.
The stages that carry a copy of another's forward (07 of 06, 11 of 10) are compared with it at
every shape, and the run says whether they agree within AA_TOLERANCE (the A/A check).

A stage whose capabilities say deterministic_backward has a third pass, bwd_det: its backward
with AttentionCShape.deterministic = 1 (bit-identical gradients), timed at the shapes of
DETERMINISTIC_SWEEPS only, as one more member of the shape's backward group (the same turns as
its default backward, by the same rule), and written as rows of pass bwd_det. The run prints,
per such stage and shape, the deterministic backward's median over the default's (and writes it
to --deterministic-file).

FLOPs follow the FlashAttention convention: forward 4*B*H*Lq*Lk*D (halved when causal), backward
2.5x forward. FP32 implementations are timed forward only (no stage has an FP32 backward), and
not at d = 128 with N = 16384 (FP32_LEFT_OUT): seconds a call for stages 00 and 01, read by no
chapter, and most of what would take `make bench` past ten minutes.

Needs PyTorch with CUDA (tensors, events and the baselines); bench/run_bench.sh checks first.
"""

import argparse
import contextlib
import csv
import ctypes
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
from schema import (BACKWARD_PASSES, CSV_COLUMNS, CSV_EXTRA_COLUMNS, FLOP_CONVENTION,  # noqa: E402
                    RATIO_BASELINES, SOL_CEILING, STAGES, read_sweeps)

TIMED_SECONDS = 0.15      # timed calls per implementation, shape and pass, and
POWER_CALL_MS = 2.0       # from calls this long on (where an H100 runs at its power limit and
POWER_TIMED_SECONDS = 0.6  # swings its clock by 15% within a run) this many seconds of them;
MIN_CALLS = 60            # at least this many of them (calls of several milliseconds swing with
MAX_TIMED_SECONDS = 1.2   # the clock: a median over 20 moved by up to 7%), within this much;
LONG_CALL_MS = 25.0       # but a call this long spans a swing of the clock by itself: it stops
LONG_MIN_CALLS = 20       # at this many calls
LONG_MAX_TIMED_SECONDS = 0.6  # or this much
SLICE_SECONDS = 0.005     # one implementation's turn
MAX_CALLS = 600           # an implementation of calls of a few microseconds stops here
BURST_CALLS = 50          # calls issued behind one GPU sleep
SLEEP_MARGIN = 1.5        # the sleep lasts this many times issuing the burst should take
MAX_SLEEP_SECONDS = 0.05
STEP_LIMIT_SECONDS = 120  # no group of one shape and pass takes this long: a stop, not a wait
HOST_BOUND = 2.0          # a call whose GPU time is under this many times its issue time sleeps
MAX_GPU_HZ = 2.0e9        # cycles per second the sleep is converted at: no H100 clock is faster
HEAVY_BYTES = 2 << 30     # workspace or intermediates beyond this: slices alone
L2_MULTIPLE = 4           # the input sets of one implementation exceed this many times the L2
MEMORY_RESERVE_BYTES = 1 << 30
AA_PAIRS = [("11_hopper_backward", "10_pingpong"), ("07_backward", "06_pipelined")]
AA_TOLERANCE = 0.02
# The deterministic backward (pass bwd_det) is timed at the shapes of these sweeps alone: the BF16
# headline, where its target is set (DETERMINISTIC_TARGET: its time at most 1.15 times the
# default backward's), and the `extra` shapes the chapters quote. At every seqlen shape it would
# add a member to 28 more backward groups of a run that must stay under ten minutes and already
# takes six and a half to eight and a half of them (docs/benchmarking.md).
DETERMINISTIC_SWEEPS = ["bf16-headline", "extra"]
DETERMINISTIC_TARGET = 1.15
# The passes timed together in one group per shape: bwd_det beside bwd, so that a stage's two
# backward passes take their slices in the same rotated turns, at the same moments of the clock,
# as every pair of implementations a ratio compares does (a group of its own, timed after the
# backward's, would put the clock's swing of several percent between the two; the A/A check
# shows what timing side by side removes). Each member keeps the rule of the module docstring:
# its own resident inputs, two untimed calls, its own slices, calls and median.
GROUP_PASSES = {"fwd": ["fwd"], "bwd": ["bwd", "bwd_det"]}
# The element types of a shape's groups, in the order they are timed: BF16 first, right after the
# previous shape's backward (BF16 too), so that its turns start where a BF16 workload runs.
GROUP_DTYPES = ["bf16", "fp32"]
# FP32 implementations are not timed at these (head_dim, sequence length) pairs; see above.
FP32_LEFT_OUT = {(128, 16384)}
# torch_sdpa (PyTorch's own dispatch) in FP32 only: in BF16 it runs one of the fused backends
# measured beside it. flash and cudnn take 16-bit inputs only.
TORCH_BACKENDS = {"bf16": ["flash", "cudnn", "efficient", "math", "eager"],
                  "fp32": ["efficient", "math", "eager", "sdpa"]}


class Skip(Exception):
    """This implementation cannot run this shape and pass here; the message says why."""


# ---- implementations --------------------------------------------------------------------------

def fp32_left_out(dtype_name, shape):
    """Why an FP32 implementation is not timed at this shape, or ""."""
    if dtype_name == "fp32" and (shape.head_dim, max(shape.len_q, shape.len_kv)) in FP32_LEFT_OUT:
        return (f"FP32 implementations are not timed at d = {shape.head_dim} with N = "
                f"{max(shape.len_q, shape.len_kv)} (bench/driver.py, FP32_LEFT_OUT)")
    return ""


class StageImplementation:
    """A stage (or a cuBLAS baseline) called through its library."""

    def __init__(self, torch, library):
        self.torch, self.library = torch, library
        caps = library.capabilities
        self.name, self.dtype_name = caps.name, caps.dtype
        self.dtype = torch.float32 if caps.dtype == "fp32" else torch.bfloat16
        self.passes = ["fwd", "bwd"] if caps.backward else ["fwd"]
        if caps.deterministic_backward:
            self.passes.append("bwd_det")

    def select(self, shape):
        pass

    @staticmethod
    def c_shape(shape, pass_name):
        """The C ABI's shape; deterministic = 1 for bwd_det (the forward ignores it)."""
        return stage_abi.Shape(*shape.key(), deterministic=pass_name == "bwd_det")

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
        return fp32_left_out(self.dtype_name, shape)

    def call_context(self, pass_name):
        return contextlib.nullcontext()

    def heavy_bytes(self, shape, pass_name):
        """What a call needs beyond its inputs and outputs (the stage's own workspace)."""
        return self.workspace(shape, pass_name)

    def workspace(self, shape, pass_name):
        c_shape = self.c_shape(shape, pass_name)
        try:
            forward = self.library.workspace_bytes(c_shape)
            if pass_name in BACKWARD_PASSES:
                return max(forward, self.library.backward_workspace_bytes(c_shape))
            return forward
        except ValueError as refusal:
            raise Skip(str(refusal))

    def prepare(self, shape, pass_name, sets, make_input):
        """call(set index) for this pass, with everything it reads made first."""
        torch, lib = self.torch, self.library
        c_shape = self.c_shape(shape, pass_name)
        backward_pass = pass_name in BACKWARD_PASSES
        stream = torch.cuda.current_stream().cuda_stream
        q_shape = (shape.batch, shape.heads, shape.len_q, shape.head_dim)
        lse_shape = (shape.batch, shape.heads, shape.len_q)
        # Per set the tensors (kept alive here) and their addresses in the C ABI's order, taken
        # once: the timed loop then spends no Python on them.
        tensors, forward_args, backward_args = [], [], []
        for _ in range(sets):
            q, k, v = make_input(shape.len_q), make_input(shape.len_kv), make_input(shape.len_kv)
            o = torch.empty(q_shape, device="cuda", dtype=self.dtype)
            lse = torch.empty(lse_shape, device="cuda", dtype=torch.float32)
            one_set = [q, k, v, o, lse]
            if backward_pass:
                one_set += [make_input(shape.len_q), torch.empty_like(q), torch.empty_like(k),
                            torch.empty_like(v)]  # dO, dQ, dK, dV
            tensors.append(one_set)
            forward_args.append([t.data_ptr() for t in one_set[:5]] + [c_shape, stream])
            backward_args.append([t.data_ptr() for t in one_set] + [c_shape, stream])

        def forward(index):
            lib.forward(*forward_args[index])

        def backward(index):
            lib.backward(*backward_args[index])

        try:
            if backward_pass:
                for index in range(sets):  # the backward's O and LSE, from the stage's own forward
                    forward(index)
            return backward if backward_pass else forward
        except ValueError as refusal:
            raise Skip(str(refusal))


class TorchImplementation:
    """One PyTorch baseline (bench/baselines.py builds the callables)."""

    def __init__(self, torch, runner, backend, dtype_name):
        self.torch, self.runner, self.backend = torch, runner, backend
        self.name, self.dtype_name = f"torch_{backend}", dtype_name
        self.dtype = torch.float32 if dtype_name == "fp32" else torch.bfloat16
        self.passes = ["fwd"] if dtype_name == "fp32" else ["fwd", "bwd"]  # no bwd_det

    def unsupported(self, shape, pass_name, gpu_capability):
        return fp32_left_out(self.dtype_name, shape)

    def workspace(self, shape, pass_name):
        return None  # measured on the first call

    def heavy_bytes(self, shape, pass_name):
        """An estimate, before any call: the math and eager paths hold the scores and the
        probabilities in memory (and keep them for the backward); the fused backends do not."""
        if self.backend not in ("math", "eager"):
            return 0
        element = 4 if self.dtype_name == "fp32" else 2
        scores = shape.batch * shape.heads * shape.len_q * shape.len_kv * element
        return scores * (4 if pass_name in BACKWARD_PASSES else 2)

    def call_context(self, pass_name):
        """The backend's sdpa_kernel context (and no_grad for the forward), entered once per
        slice rather than once per call."""
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
    """The SM clock (MHz) and board power (W) from NVML, the driver's own library (called through
    ctypes: no Python package needed), or nothing where it is missing."""

    def __init__(self, properties, device_index):
        self.nvml, self.handle, self.why_not = None, None, ""
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if nvml.nvmlInit_v2() != 0:
                raise OSError("nvmlInit_v2 failed")
            handle, status = ctypes.c_void_p(), -1
            bus = getattr(properties, "pci_bus_id", None)
            if bus is not None:  # the CUDA device's own board, whatever CUDA_VISIBLE_DEVICES says
                bus_id = (f"{getattr(properties, 'pci_domain_id', 0):08x}:{bus:02x}:"
                          f"{getattr(properties, 'pci_device_id', 0):02x}.0").encode()
                status = nvml.nvmlDeviceGetHandleByPciBusId_v2(bus_id, ctypes.byref(handle))
            if status != 0:
                status = nvml.nvmlDeviceGetHandleByIndex_v2(device_index, ctypes.byref(handle))
            if status != 0:
                raise OSError(f"no NVML handle for the device (status {status})")
            self.nvml, self.handle = nvml, handle
        except (OSError, AttributeError) as error:
            self.why_not = f"no NVML ({error})"

    def read(self):
        if self.handle is None:
            return None, None
        clock, milliwatts = ctypes.c_uint(), ctypes.c_uint()
        if (self.nvml.nvmlDeviceGetClockInfo(self.handle, 1, ctypes.byref(clock)) != 0  # SM
                or self.nvml.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(milliwatts)) != 0):
            return None, None
        return clock.value, milliwatts.value / 1000.0


class MemoryPool:
    """The device's CUDA memory pool, from which the stages allocate their workspace
    (cudaMallocAsync). By default it hands its memory back to the driver at every synchronize,
    and the schedule synchronises after every turn: each turn's first call of a stage with a
    workspace would map it afresh, inside its timed call, which no program that calls the
    stage in a loop pays. So the pool keeps its memory while a group is timed (release
    threshold UINT64_MAX) and is trimmed after it, through the driver API (ctypes)."""

    RELEASE_THRESHOLD = 4  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD

    def __init__(self, device_index):
        self.cuda, self.pool, self.why_not = None, None, ""
        try:
            cuda = ctypes.CDLL("libcuda.so.1")
            device, pool = ctypes.c_int(), ctypes.c_void_p()
            if (cuda.cuDeviceGet(ctypes.byref(device), device_index) != 0
                    or cuda.cuDeviceGetMemPool(ctypes.byref(pool), device) != 0):
                raise OSError("no memory pool for the device")
            threshold = ctypes.c_uint64(2**64 - 1)
            if cuda.cuMemPoolSetAttribute(pool, self.RELEASE_THRESHOLD,
                                          ctypes.byref(threshold)) != 0:
                raise OSError("cuMemPoolSetAttribute failed")
            self.cuda, self.pool = cuda, pool
        except (OSError, AttributeError) as error:
            self.why_not = f"the stages' memory pool is left as it is ({error})"

    def trim(self):
        if self.pool is not None:
            self.cuda.cuMemPoolTrimTo(self.pool, ctypes.c_size_t(0))


class Resident:
    """One implementation made ready for a shape and pass: its inputs, its call, its timings."""

    def __init__(self, impl, entry, call, pass_name):
        self.impl, self.entry, self.call, self.pass_name = impl, entry, call, pass_name
        self.index = 0          # the next input set (call rotates over them)
        self.gpu_ms = 0.0       # one call's GPU time, from the second untimed call
        self.issue_seconds = 0.0  # Python's time to issue one call (untimed calls, idle GPU)
        self.pending = []       # this turn's (begin, end) events
        self.times = []         # every timed call, ms
        self.slices = []        # each slice's median, ms
        self.credit_ms = 0.0    # time of calls this member may still issue (its turns' credit)
        self.group_window = None  # the group's window, seconds (set by time_group)

    def typical_ms(self):
        """A call's length as the rule reads it: the median of the timed calls once there are
        five, else the second untimed call's (which can carry a one-time cost, or come out
        short)."""
        return statistics.median(self.times) if len(self.times) >= 5 else self.gpu_ms

    def own_window(self):
        typical_ms = self.typical_ms()
        return POWER_TIMED_SECONDS if POWER_CALL_MS <= typical_ms < LONG_CALL_MS else TIMED_SECONDS

    def calls_window(self):
        """The seconds this member needs for its window and its MIN_CALLS calls both (at most
        MAX_TIMED_SECONDS)."""
        return min(max(self.own_window(), MIN_CALLS * self.typical_ms() / 1e3), MAX_TIMED_SECONDS)

    def take_credit(self):
        """This turn's calls: SLICE_SECONDS more credit, and the calls it covers (none when a
        call is much longer than the credit, one at least for a call of LONG_CALL_MS or more),
        no more than MAX_CALLS spread over the turns of a short call's window. The credit left
        over is kept (a negative one too: the next turns pay it back)."""
        call_ms = max(self.typical_ms(), 1e-3)
        self.credit_ms += SLICE_SECONDS * 1e3
        wanted = round(self.credit_ms / call_ms)
        if call_ms >= LONG_CALL_MS:
            wanted = max(wanted, 1)  # a long call takes a turn of its own, one call each time
        calls = min(wanted, math.ceil(MAX_CALLS * SLICE_SECONDS / TIMED_SECONDS),
                    max(1, MAX_CALLS - len(self.times)))
        self.credit_ms -= calls * call_ms
        if calls < wanted:  # capped: a short call's surplus is not carried beyond one slice
            self.credit_ms = min(self.credit_ms, SLICE_SECONDS * 1e3)
        return calls

    def done(self):
        timed_ms = sum(self.times)
        typical_ms = self.typical_ms()
        long_call = typical_ms >= LONG_CALL_MS
        min_calls = LONG_MIN_CALLS if long_call else MIN_CALLS
        max_seconds = LONG_MAX_TIMED_SECONDS if long_call else MAX_TIMED_SECONDS
        window = self.own_window()
        if not long_call and self.group_window is not None:
            window = max(window, self.group_window)
        return (len(self.times) >= MAX_CALLS or timed_ms >= max_seconds * 1e3
                or (timed_ms >= window * 1e3 and len(self.times) >= min_calls))

    def issue(self, torch, calls):
        """Issues `calls` timed calls, behind a GPU sleep per burst where the host is the
        bottleneck. The sleep is sized from issue_seconds, measured once on an idle GPU: a
        burst issued behind a sleep can block on a full launch queue, and its time would
        grow the next sleep, and so on."""
        host_bound = self.gpu_ms < HOST_BOUND * self.issue_seconds * 1e3
        with self.impl.call_context(self.pass_name):
            for first in range(0, calls, BURST_CALLS):
                count = min(BURST_CALLS, calls - first)
                events = [(torch.cuda.Event(enable_timing=True),
                           torch.cuda.Event(enable_timing=True)) for _ in range(count)]
                if host_bound:
                    sleep = min(SLEEP_MARGIN * count * self.issue_seconds, MAX_SLEEP_SECONDS)
                    torch.cuda._sleep(int(sleep * MAX_GPU_HZ))
                for begin, end in events:
                    begin.record()
                    self.call(self.index)
                    end.record()
                    self.index += 1
                self.pending += events

    def collect(self):
        """After a synchronize: the turn's times into the record."""
        if self.pending:
            times = [begin.elapsed_time(end) for begin, end in self.pending]
            self.times.extend(times)
            self.slices.append(statistics.median(times))
            self.pending = []


def make_resident(torch, impl, shape, pass_name, entry, rotation_bytes):
    """Inputs made, two untimed calls run: a Resident, or raises Skip."""
    element = 4 if impl.dtype_name == "fp32" else 2
    q_bytes = shape.batch * shape.heads * shape.len_q * shape.head_dim * element
    kv_bytes = shape.batch * shape.heads * shape.len_kv * shape.head_dim * element
    backward_pass = pass_name in BACKWARD_PASSES
    per_set = (2 * q_bytes + 2 * kv_bytes) * (2 if backward_pass else 1)
    workspace = impl.workspace(shape, pass_name)
    free, _ = torch.cuda.mem_get_info()
    usable = free - MEMORY_RESERVE_BYTES - (workspace or 0)
    if usable < per_set:
        raise Skip(f"not enough device memory: needs {per_set / 2**30:.2f} GiB of buffers + "
                   f"{(workspace or 0) / 2**30:.2f} GiB of workspace, {free / 2**30:.2f} GiB free")
    sets = max(1, min(-(-rotation_bytes // per_set), int(usable // (2 * per_set)) or 1))

    # The inputs, randn + 0.5, drawn in one go per length (one kernel, not hundreds): per set
    # Q (and dO for the backward) of len_q, K and V of len_kv.
    draws = {}
    for length, count in ((shape.len_q, 2 if backward_pass else 1), (shape.len_kv, 2)):
        draws[length] = draws.get(length, 0) + count * sets
    pools = {}

    def make_input(length):
        if length not in pools:
            block = torch.randn(draws[length], shape.batch, shape.heads, length, shape.head_dim,
                                device="cuda", dtype=impl.dtype).add_(0.5)
            pools[length] = list(block.unbind(0))
        return pools[length].pop().detach()

    impl.select(shape)
    with guarded(torch, impl), impl.call_context(pass_name):
        prepared = impl.prepare(shape, pass_name, sets, make_input)

        def call(index):
            return prepared(index % sets)
        # The first call pays the one-time costs; for PyTorch it also tells the workspace: the
        # peak one call allocates beyond its inputs, less its outputs.
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        outputs = call(0)
        torch.cuda.synchronize()
        if workspace is None:
            outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
            output_bytes = sum(t.numel() * t.element_size() for t in outputs if hasattr(t, "numel"))
            workspace = max(0, torch.cuda.max_memory_allocated() - base - output_bytes)
        del outputs
        entry["workspace"] = workspace
        resident = Resident(impl, entry, call, pass_name)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        issued = time.perf_counter()  # what issue() does per call, on an idle GPU
        start.record()
        call(1)
        stop.record()
        resident.issue_seconds = time.perf_counter() - issued
        stop.synchronize()
        resident.gpu_ms = start.elapsed_time(stop)
        resident.index = 2
    return resident


@contextlib.contextmanager
def guarded(torch, impl):
    """Turns a refusal or a lack of memory into Skip; lets a fault through."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        except torch.cuda.OutOfMemoryError as error:
            raise Skip("out of device memory: " + baselines.first_line(error))
        except ValueError as refusal:  # a stage's launcher refused the shape
            raise Skip(str(refusal))
        except RuntimeError as error:
            if "CUDA error" in str(error) or isinstance(impl, StageImplementation):
                raise  # a fault, not a refusal: the context may be unusable
            raise Skip(baselines.refusal_reason(caught) or baselines.first_line(error))


def compared_in_ratios(implementation):
    """Whether the course's ratios compare this implementation: a stage, cuDNN or FlashAttention-2."""
    return implementation in STAGES or implementation in RATIO_BASELINES


def group_windows(residents):
    """The group's windows, (for the members the ratios compare, for the others), among calls
    below LONG_CALL_MS: the others share the longest of their own windows; the compared ones
    also wait for every compared member's MIN_CALLS calls, so that a member of long calls does
    not go on alone, at another clock, after the members it is compared with have stopped."""
    short = [r for r in residents if r.typical_ms() < LONG_CALL_MS]
    if not short:
        return None, None
    plain = max(r.own_window() for r in short)
    compared = [r.calls_window() for r in short if compared_in_ratios(r.impl.name)]
    return max([plain] + compared), plain


def time_group(torch, group, shape, state, rotation_bytes, clocks, pool):
    """Makes the group's members, (implementation, pass) pairs, resident, then times them in
    turns of slices."""
    residents = []
    try:
        for impl, pass_name in group:
            entry = state[member_key(impl, pass_name)]
            try:
                residents.append(make_resident(torch, impl, shape, pass_name, entry,
                                               rotation_bytes))
            except Skip as skip:
                entry["skip"] = str(skip)
                gc.collect()  # the exception's frames may hold this shape's tensors
        turn, started = 0, time.perf_counter()
        while True:
            compared_window, plain_window = group_windows(residents)
            for resident in residents:
                resident.group_window = (compared_window if compared_in_ratios(resident.impl.name)
                                         else plain_window)
            waiting = [r for r in residents if not r.done()]
            if not waiting:
                break
            if time.perf_counter() - started > STEP_LIMIT_SECONDS:
                raise SystemExit(
                    f"driver.py: {shape.describe()} still timing after "
                    f"{STEP_LIMIT_SECONDS} s (a bug in the schedule): " + "; ".join(
                        f"{member_key(r.impl, r.pass_name)} gpu {r.gpu_ms:.4g} ms issue "
                        f"{r.issue_seconds * 1e3:.4g} ms {len(r.times)} calls "
                        f"{sum(r.times):.4g} ms" for r in waiting))
            shift = turn % len(waiting)
            order = waiting[shift:] + waiting[:shift]
            for resident in (order[::-1] if turn % 2 else order):
                calls = resident.take_credit()
                if calls:
                    with guarded(torch, resident.impl):
                        resident.issue(torch, calls)
            torch.cuda.synchronize()
            clock, power = clocks.read()
            for resident in order:
                resident.collect()
                if clock is not None:
                    resident.entry["clock"].append(clock)
                    resident.entry["power"].append(power)
            turn += 1
        for resident in residents:
            entry = resident.entry
            entry["times"], entry["slices"] = resident.times, resident.slices
    except Skip as skip:  # a call refused in the middle of the slices: the group's rows say so
        for resident in residents:
            if not resident.entry["skip"] and not resident.entry.get("times"):
                resident.entry["skip"] = str(skip)
    finally:
        del residents
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        pool.trim()


def key(impl):
    return impl.name + "/" + impl.dtype_name


def member_key(impl, pass_name):
    return key(impl) + "/" + pass_name


def deterministic_shapes(sweeps, names):
    """The shapes bwd_det is timed at: those of DETERMINISTIC_SWEEPS among the run's sweeps."""
    keys = []
    for name in names:
        if name in DETERMINISTIC_SWEEPS:
            keys += [Shape(*fields).key() for fields in sweeps.get(name, [])]
    return set(keys)


def schedule_groups(members, heavy):
    """The groups one shape's (implementation, pass) members are timed in, in order: one group per
    element type, BF16 first (GROUP_DTYPES), then each member whose key is in `heavy` alone.

    A ratio compares two implementations of one element type, so each type takes its turns apart:
    FP32 calls in a BF16 group's turns lower the board power, and its BF16 members would be timed
    at clocks a BF16 workload does not run at (docs/benchmarking.md, "One element type per
    group")."""
    groups = []
    others = sorted({impl.dtype_name for impl, _ in members} - set(GROUP_DTYPES))
    for dtype_name in GROUP_DTYPES + others:
        group = [(impl, pass_name) for impl, pass_name in members
                 if impl.dtype_name == dtype_name and member_key(impl, pass_name) not in heavy]
        if group:
            groups.append(group)
    return groups + [[(impl, pass_name)] for impl, pass_name in members
                     if member_key(impl, pass_name) in heavy]


def group_members(implementations, shape, step_pass, deterministic_keys):
    """(implementation, pass) pairs of one shape's group for the step's pass: bwd_det where the
    implementation has it and the shape is one of DETERMINISTIC_SWEEPS'."""
    members = []
    for impl in implementations:
        for pass_name in GROUP_PASSES[step_pass]:
            if pass_name not in impl.passes:
                continue
            if pass_name == "bwd_det" and shape.key() not in deterministic_keys:
                continue
            members.append((impl, pass_name))
    return members


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
    parser.add_argument("--deterministic-file",
                        help="where to write the deterministic backward's ratios to the default")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--no-torch-baselines", action="store_true")
    parser.add_argument("--dtypes", default="fp32,bf16",
                        help="time only the implementations of these element types")
    arguments = parser.parse_args()
    if not arguments.describe and (arguments.stages is None or not arguments.csv):
        parser.error("--stages and --csv are needed")
    return arguments


def method():
    return (f"interleaved slices (bench/driver.py): per shape and pass, every implementation "
            f"resident and called twice untimed, then, one group per element type (bf16 "
            f"first), turns in a rotating order, each giving every "
            f"implementation {SLICE_SECONDS * 1e3:g} ms of credit for calls, until each has {TIMED_SECONDS:g} s of timed calls "
            f"({POWER_TIMED_SECONDS:g} s for calls of {POWER_CALL_MS:g} ms or more) and "
            f"{MIN_CALLS} calls (at most {MAX_TIMED_SECONDS:g} s or {MAX_CALLS} calls; calls of "
            f"{LONG_CALL_MS:g} ms or more: {LONG_MIN_CALLS} calls, at most "
            f"{LONG_MAX_TIMED_SECONDS:g} s; the window the group's longest, for the stages, cuDNN "
            f"and FlashAttention-2 long enough for all their calls); "
            f"host-bound calls behind a GPU sleep; implementations beyond "
            f"{HEAVY_BYTES >> 30} GiB of workspace alone; median over calls")


def main():
    arguments = parse_arguments()
    if arguments.describe:
        print(method())
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
    clocks = Clocks(properties, device)
    pool = MemoryPool(device)

    implementations = []
    for suite in [s for s in arguments.stages.split(",") if s]:
        implementations.append(StageImplementation(torch, stage_abi.load(suite)))
    if not arguments.no_torch_baselines:
        runner = baselines.Runner(torch)
        for dtype_name in ("fp32", "bf16"):
            for backend in TORCH_BACKENDS[dtype_name]:
                implementations.append(TorchImplementation(torch, runner, backend, dtype_name))

    dtypes = set(arguments.dtypes.split(","))
    implementations = [impl for impl in implementations if impl.dtype_name in dtypes]

    ceilings = {}
    if arguments.ceilings_file:
        ceiling_gpu, ceilings = baselines.read_ceilings(arguments.ceilings_file)
        if ceiling_gpu != gpu:
            print(f"the ceilings were measured on {ceiling_gpu}, not {gpu}: no % of SOL")
            ceilings = {}

    sweeps = read_sweeps()
    shapes, seen = [], set()
    sweep_names = [n for n in arguments.sweep.split(",") if n]
    for name in sweep_names:
        if name not in sweeps:
            raise SystemExit(f"no sweep '{name}' in bench/sweeps.txt; known: "
                             f"{' '.join(sorted(sweeps))}")
        for fields in sweeps[name]:
            if fields not in seen:
                seen.add(fields)
                shapes.append(Shape(*fields))

    print(f"{gpu}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
          f"{len(implementations)} implementations x {len(shapes)} shapes; "
          f"{method()}", flush=True)
    print(FLOP_CONVENTION, flush=True)
    if clocks.why_not:
        print(f"clocks and power not recorded: {clocks.why_not}", flush=True)
    if pool.why_not:
        print(pool.why_not, flush=True)

    out = open(arguments.csv, "w", newline="")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS + CSV_EXTRA_COLUMNS)
    results = {}
    started = time.time()
    deterministic_keys = deterministic_shapes(sweeps, sweep_names)
    steps = [(shape, step_pass) for shape in shapes for step_pass in ("fwd", "bwd")]
    for step, (shape, step_pass) in enumerate(steps, 1):
        active, skipped = [], []
        for impl, pass_name in group_members(implementations, shape, step_pass,
                                             deterministic_keys):
            reason = impl.unsupported(shape, pass_name, gpu_capability)
            (skipped if reason else active).append((impl, pass_name, reason))
        state = {member_key(impl, pass_name): {"clock": [], "power": [], "skip": "",
                                               "workspace": None}
                 for impl, pass_name, _ in active}
        members, heavy = [], set()
        for impl, pass_name, _ in active:
            try:
                if impl.heavy_bytes(shape, pass_name) > HEAVY_BYTES:
                    heavy.add(member_key(impl, pass_name))
                members.append((impl, pass_name))
            except Skip as skip:
                state[member_key(impl, pass_name)]["skip"] = str(skip)
        for group in schedule_groups(members, heavy):
            time_group(torch, group, shape, state, rotation_bytes, clocks, pool)
        summary = []
        for impl, pass_name, reason in skipped:
            write_row(writer, gpu, impl, shape, pass_name, None, reason, arguments.commit, ceilings)
        for impl, pass_name, _ in active:
            entry = state[member_key(impl, pass_name)]
            if entry["skip"] or not entry.get("times"):
                write_row(writer, gpu, impl, shape, pass_name, None, entry["skip"] or "not run",
                          arguments.commit, ceilings)
                continue
            row = write_row(writer, gpu, impl, shape, pass_name, entry, "", arguments.commit,
                            ceilings)
            results[(impl.name, impl.dtype_name, shape.key(), pass_name)] = row
            label = "" if pass_name == step_pass else f" {pass_name}"
            summary.append(f"{impl.name}/{impl.dtype_name}{label} {row['median_ms']:.4g}")
        out.flush()
        elapsed = time.time() - started
        print(f"[{step}/{len(steps)}, {elapsed / 60:.1f} min] {step_pass} {shape.describe()}: "
              + "; ".join(summary) + (f" ({len(skipped)} skipped)" if skipped else ""), flush=True)
    out.close()
    status = aa_check(results, shapes, arguments.aa_file)
    deterministic_stages = [impl for impl in implementations if "bwd_det" in impl.passes]
    headline = [Shape(*fields) for fields in sweeps.get("bf16-headline", [])]
    deterministic_check(results, deterministic_stages,
                        [shape for shape in shapes if shape.key() in deterministic_keys],
                        headline[0] if headline else None, arguments.deterministic_file)
    return status


def write_row(writer, gpu, impl, shape, pass_name, entry, skip, commit, ceilings):
    flops = shape.flops(pass_name)
    common = [gpu, impl.name, impl.dtype_name, shape.batch, shape.heads, shape.len_q, shape.len_kv,
              shape.head_dim, int(shape.causal), pass_name]
    if entry is None:
        workspace = ""
        writer.writerow(common + ["", "", "", "", workspace, commit, f"skipped: {skip}",
                                  "", "", "", "", "", ""])
        return None
    median_ms = statistics.median(entry["times"])
    tflops = flops / (median_ms * 1e-3) / 1e12
    ceiling = ceilings.get(SOL_CEILING[impl.dtype_name], 0.0)
    pct = f"{100 * tflops / ceiling:.4g}" if ceiling else ""
    clock = f"{statistics.median(entry['clock']):.0f}" if entry["clock"] else ""
    power = f"{statistics.median(entry['power']):.0f}" if entry["power"] else ""
    workspace = "" if entry["workspace"] is None else str(entry["workspace"])
    slices = entry["slices"]
    writer.writerow(common + [f"{median_ms:.6g}", f"{min(entry['times']):.6g}", f"{tflops:.5g}",
                              pct, workspace, commit, "ok", len(slices), f"{min(slices):.6g}",
                              f"{max(slices):.6g}", len(entry["times"]), clock, power])
    return {"median_ms": median_ms}


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


def deterministic_check(results, stages, shapes, headline, path):
    """Per stage with a deterministic backward and per shape of DETERMINISTIC_SWEEPS in the run:
    the median time of its bwd_det over its bwd's, two members of one group (GROUP_PASSES).
    Informative: the run's status does not depend on it."""
    lines = [f"Deterministic backward: its median time over the default backward's, per stage "
             f"and shape (both timed in the same turns; the target at the BF16 headline: at most "
             f"{DETERMINISTIC_TARGET:.2f})"]
    if not stages:
        lines.append("no stage with a deterministic backward in this run")
    elif not shapes:
        lines.append(f"no shape of {', '.join(DETERMINISTIC_SWEEPS)} in this run's sweeps")
    for impl in stages if shapes else []:
        prefix = f"{impl.name} deterministic backward / default:"
        for shape in shapes:
            deterministic = results.get((impl.name, impl.dtype_name, shape.key(), "bwd_det"))
            default = results.get((impl.name, impl.dtype_name, shape.key(), "bwd"))
            if not (deterministic and default):
                lines.append(f"{prefix} {shape.tag()} not timed (the CSV's bwd and bwd_det rows "
                             f"say why)")
                continue
            ratio = deterministic["median_ms"] / default["median_ms"]
            lines.append(f"{prefix} {shape.tag()} {ratio:.3f}")
            if headline is not None and shape.key() == headline.key():
                lines.append(f"{impl.name} at the BF16 headline: "
                             f"{'within' if ratio <= DETERMINISTIC_TARGET else 'BEYOND'} the "
                             f"target of {DETERMINISTIC_TARGET:.2f}")
    text = "\n".join(lines)
    print(text, flush=True)
    if path:
        with open(path, "w") as deterministic_file:
            deterministic_file.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
