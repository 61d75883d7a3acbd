"""The one Python definition of what the C++ driver (common/bench.cpp) and the Python scripts
share: the results CSV's columns, the FLOP convention, the sweeps file's format, and the stage
list (read from the top-level Makefile's STAGES, its one place)."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Must match kCsvHeader in common/bench.cpp.
CSV_COLUMNS = ["gpu", "stage", "dtype", "batch", "heads", "len_q", "len_kv", "head_dim", "causal",
               "pass", "median_ms", "min_ms", "tflops", "pct_sol", "workspace_bytes", "commit",
               "status"]

# Written after CSV_COLUMNS by make bench's schedule (bench/driver.py); absent from runs before it
# and from a single stage's `bench_<stage> --csv`. slices: the implementation's turns in the
# interleaved schedule (median_ms is the median over all its calls; slice_min_ms / slice_max_ms
# the fastest and slowest slice's median); calls: timed calls; sm_clock_mhz, power_w: NVML's
# readings after each turn, the median over its turns.
CSV_EXTRA_COLUMNS = ["slices", "slice_min_ms", "slice_max_ms", "calls", "sm_clock_mhz", "power_w"]

# The pass column: fwd, bwd, and bwd_det, the deterministic backward (AttentionShape::deterministic,
# bit-identical gradients) of the stages whose capabilities say deterministic_backward, which
# bench/driver.py times at the shapes of its DETERMINISTIC_SWEEPS only. Both backward passes
# count the backward's FLOPs. The per-stage binary (common/bench.cpp) writes fwd and bwd alone.
PASSES = ["fwd", "bwd", "bwd_det"]
BACKWARD_PASSES = ["bwd", "bwd_det"]

# Must match kCeilingsHeader in common/ceilings.h.
CEILINGS_COLUMNS = ["gpu", "ceiling", "value", "unit", "median_ms", "method"]

# Every ceiling a ceilings.csv may hold, and who measures it. Files written before a name was
# added simply lack its row; readers treat a missing row as "not measured".
CEILINGS = {
    "bf16_gemm": "common/ceilings.cu: best cuBLAS BF16 GEMM rate over a few large shapes",
    "fp32_gemm": "common/ceilings.cu: best cuBLAS FP32 GEMM rate (no TF32) over the same shapes",
    "copy": "common/ceilings.cu: device-to-device copy, bytes read plus bytes written",
    "bf16_mma_sync": "common/ceilings.cu: back-to-back mma.sync.m16n8k16 from registers",
    "bf16_torch_matmul": "bench/baselines.py: best torch.matmul BF16 rate over the same shapes",
    "fp32_torch_matmul": "bench/baselines.py: best torch.matmul FP32 rate (TF32 off), same shapes",
}
# The ceiling "% of SOL" is taken against, per element type (common/bench.cpp does the same).
SOL_CEILING = {"bf16": "bf16_gemm", "fp16": "bf16_gemm", "fp32": "fp32_gemm"}
# The shapes (m, n, k) both GEMM ceilings are measured on; must match kGemmShapes in
# common/ceilings.cu.
GEMM_SHAPES = [(8192, 8192, 8192), (8192, 8192, 4096), (16384, 8192, 8192)]

# The baselines, in the one order every table, figure legend and listing uses (after the stages,
# which go by their numbers): the cuBLAS eager attention (bench/cublas_eager.cu, built as a stage),
# then PyTorch's scaled_dot_product_attention by backend (torch_flash is FlashAttention-2), its
# plain eager version, and its own dispatch (FP32 only).
BASELINES = ["cublas_fp32", "cublas_bf16", "torch_flash", "torch_cudnn", "torch_efficient",
             "torch_math", "torch_eager", "torch_sdpa"]

# The baselines the course's ratios compare the BF16 stages with (bench/compare_runs.py checks
# them run against run; bench/driver.py times them and the stages over one window per group).
RATIO_BASELINES = ["torch_cudnn", "torch_flash"]

FLOP_CONVENTION = ("FLOPs follow the FlashAttention convention: forward 4*B*H*Lq*Lk*D (halved "
                   "when causal), backward 2.5x forward; TFLOP/s = FLOPs / median time")


def read_sweeps(path=REPO / "bench" / "sweeps.txt"):
    """{name: [(batch, heads, len_q, len_kv, head_dim, causal), ...]} from lines
    `name batch heads len_q len_kv head_dim causal` (# starts a comment)."""
    sweeps = {}
    with open(path) as sweeps_file:
        for number, line in enumerate(sweeps_file, 1):
            fields = line.split("#")[0].split()
            if not fields:
                continue
            if len(fields) != 7:
                raise SystemExit(f"{path}:{number}: expected "
                                 "'name batch heads len_q len_kv head_dim causal'")
            sweeps.setdefault(fields[0], []).append(tuple(int(f) for f in fields[1:]))
    return sweeps


def read_stages(makefile=REPO / "Makefile"):
    """The stage folders, in order, from `STAGES := ...` (with its continuation lines)."""
    text = Path(makefile).read_text()
    match = re.search(r"^STAGES\s*:=((?:[^\n]*\\\n)*[^\n]*)", text, re.MULTILINE)
    if not match:
        raise SystemExit(f"{makefile}: no STAGES := line")
    return match.group(1).replace("\\\n", " ").split()


STAGES = read_stages()
