#!/usr/bin/env python3
"""Draw the benchmark figures from the CSVs that `make bench` writes.

    python3 bench/plots.py [RESULTS_DIR] [--out docs/img]

RESULTS_DIR is a folder `bench/results/<gpu>/` holding `results.csv` (one row per
implementation, shape and pass), `ceilings.csv` (the measured GEMM and copy ceilings) and
`system.txt`. Without it, the folder named by $BENCH_RESULTS_DIR is used, else the newest
folder under bench/results/ that has a results.csv.

Every figure is drawn only from rows the benchmark measured: a figure whose data is absent is
skipped with a printed reason, and a shape an implementation skipped is left out of its line.
The same functions draw the figures of docs/benchmarks.ipynb, so the notebook and docs/img/
always agree. Each figure function takes a `Results` and returns {file stem: Figure}; it raises
`NoData` when it has nothing to draw.

FLOPs follow the FlashAttention convention, as the benchmark's TFLOP/s column does:
forward 4*B*H*Lq*Lkv*d, halved when causal; backward 2.5 times the forward.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; the notebook shows the PNG bytes, not a live backend

from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RESULTS_ROOT = REPO / "bench" / "results"
ENV_RESULTS = "BENCH_RESULTS_DIR"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from schema import (BACKWARD_PASSES, BASELINES, CSV_COLUMNS as COLUMNS, SOL_CEILING,  # noqa: E402
                    STAGES, read_sweeps)

FLOP_NOTE = ("FLOPs: FlashAttention convention, forward 4·B·H·Lq·Lkv·d (halved when causal), "
             "backward 2.5× forward; times are medians over timed calls.")

SWEEPS = REPO / "bench" / "sweeps.txt"
# The shapes the FP32 and the BF16 chapters are judged on: B, H, Lq, Lkv, d. Read from
# bench/sweeps.txt (`name batch heads len_q len_kv head_dim causal` per line) when it is there.
HEADLINES = {
    "fp32_headline": (8, 12, 4096, 4096, 64),
    "bf16_headline": (1, 8, 4096, 8192, 128),
}


def _read_headlines(path: Path = SWEEPS) -> None:
    if not path.is_file():
        return
    for name, shapes in read_sweeps(path).items():
        if name in ("fp32-headline", "bf16-headline"):
            HEADLINES[name.replace("-", "_")] = shapes[0][:5]


_read_headlines()
NAIVE = "00_naive"
# A backward stage whose forward is an earlier stage's code verbatim (bench/check_forward_copy.py,
# run by `make docs-check`, proves it): the figures draw that forward kernel once, under the
# stage that introduced it.
FORWARD_COPIES = {"07_backward": "06_pipelined", "11_hopper_backward": "10_pingpong"}

DPI = 120
# The source texts the figures answer, named as they name themselves (../shared/seeds/README.md).
SDPA_ARTICLE = ("the article \"Attention To Flash Attention: Out Performing SPDA with CUDA Kernels "
                "From Scratch\"")
SOL_ARTICLE = "gau-nernst's \"Writing Speed-of-Light Flash Attention for 5090 in CUDA C++\""
PALLAS_ARTICLE = "\"How to Write a Flash Attention Kernel in Pallas\""
SERIES_ARTICLE = ("\"Writing a Custom Attention Kernel: From Naive to Tiled to "
                  "FlashAttention-Style\" (CUDA Kernel Engineering, part 19)")
RTX4050_REPOSITORY = "the RTX 4050 Mobile CUDA attention repository"  # it gives no title
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


class NoData(Exception):
    """A figure has nothing to draw; the message says what is missing."""


# ---- loading --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    gpu: str
    stage: str
    dtype: str
    batch: int
    heads: int
    len_q: int
    len_kv: int
    head_dim: int
    causal: bool
    pass_: str          # "fwd", "bwd" or "bwd_det" (the deterministic backward; no figure draws it)
    median_ms: float | None
    min_ms: float | None
    tflops: float | None
    pct_sol: float | None
    workspace_bytes: int | None
    commit: str
    status: str

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.median_ms is not None and self.median_ms > 0

    @property
    def impl(self) -> tuple[str, str]:
        return (self.stage, self.dtype)

    @property
    def shape(self) -> tuple[int, int, int, int, int, bool]:
        return (self.batch, self.heads, self.len_q, self.len_kv, self.head_dim, self.causal)


@dataclass
class Results:
    directory: Path
    rows: list[Row]
    ceilings: dict[str, tuple[float, str]] = field(default_factory=dict)  # name -> (value, unit)
    system: str = ""

    @property
    def gpu(self) -> str:
        for row in self.rows:
            if row.gpu:
                return row.gpu
        return self.directory.name

    @property
    def commits(self) -> list[str]:
        return sorted({row.commit for row in self.rows if row.commit})

    def ok_rows(self, **where) -> list[Row]:
        return [r for r in self.rows if r.ok and all(getattr(r, k) == v for k, v in where.items())]

    def ceiling(self, name: str) -> float | None:
        entry = self.ceilings.get(name)
        return entry[0] if entry and entry[0] > 0 else None


def _number(text: str, kind=float):
    text = (text or "").strip()
    if not text:
        return None
    try:
        return kind(float(text)) if kind is int else kind(text)
    except ValueError:
        return None


def _pass_name(text: str) -> str:
    text = text.strip().lower()
    return {"forward": "fwd", "backward": "bwd"}.get(text, text)


def read_results_csv(path: Path) -> list[Row]:
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing columns {', '.join(missing)}")
        rows = []
        for record in reader:
            if record.get("gpu") == "gpu":  # a repeated header from concatenated files
                continue
            rows.append(Row(
                gpu=record["gpu"].strip(),
                stage=record["stage"].strip(),
                dtype=record["dtype"].strip().lower(),
                batch=_number(record["batch"], int),
                heads=_number(record["heads"], int),
                len_q=_number(record["len_q"], int),
                len_kv=_number(record["len_kv"], int),
                head_dim=_number(record["head_dim"], int),
                causal=record["causal"].strip().lower() in ("1", "true", "yes"),
                pass_=_pass_name(record["pass"]),
                median_ms=_number(record["median_ms"]),
                min_ms=_number(record["min_ms"]),
                tflops=_number(record["tflops"]),
                pct_sol=_number(record["pct_sol"]),
                workspace_bytes=_number(record["workspace_bytes"], int),
                commit=record["commit"].strip(),
                status=record["status"].strip(),
            ))
    return rows


def read_ceilings_csv(path: Path) -> dict[str, tuple[float, str]]:
    """`gpu,ceiling,value,unit,median_ms,method`, one row per ceiling (common/ceilings.h)."""
    ceilings = {}
    with open(path, newline="") as handle:
        for record in csv.DictReader(handle):
            value = _number(record.get("value", ""))
            name = (record.get("ceiling") or "").strip()
            if name and value is not None:
                ceilings[name] = (value, (record.get("unit") or "").strip())
    return ceilings


def find_results_dir(root: Path = RESULTS_ROOT, newest: bool = True) -> Path | None:
    """$BENCH_RESULTS_DIR if set, else the newest (or, with newest=False, the first by name)
    folder under `root` that holds a results.csv."""
    if os.environ.get(ENV_RESULTS):
        return Path(os.environ[ENV_RESULTS])
    if not root.is_dir():
        return None
    found = sorted(p.parent for p in root.glob("*/results.csv"))
    if not found:
        return None
    if newest:
        return max(found, key=lambda p: ((p / "results.csv").stat().st_mtime, p.name))
    return found[0]


def load(directory: Path | str) -> Results:
    """Reads one results folder. Later rows win over earlier rows for the same
    (implementation, shape, pass), so a CSV appended by a re-run shows the re-run."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no results folder {directory}")
    paths = [directory / "results.csv"] if (directory / "results.csv").is_file() else sorted(
        p for p in directory.glob("*.csv") if p.name != "ceilings.csv")
    if not paths:
        raise FileNotFoundError(f"no results.csv in {directory}")
    latest: dict[tuple, Row] = {}
    for path in paths:
        for row in read_results_csv(path):
            latest[(row.stage, row.dtype, row.shape, row.pass_)] = row
    ceilings = {}
    if (directory / "ceilings.csv").is_file():
        ceilings = read_ceilings_csv(directory / "ceilings.csv")
    system = (directory / "system.txt").read_text() if (directory / "system.txt").is_file() else ""
    return Results(directory, list(latest.values()), ceilings, system)


# ---- arithmetic -----------------------------------------------------------------------------

def flops(row: Row) -> float:
    forward = 4.0 * row.batch * row.heads * row.len_q * row.len_kv * row.head_dim
    if row.causal:
        forward /= 2
    return forward * (2.5 if row.pass_ in BACKWARD_PASSES else 1.0)


def element_bytes(dtype: str) -> int:
    return ELEMENT_BYTES.get(dtype, 4)


def min_bytes(row: Row) -> float:
    """Each input read once, each output written once (common/harness.cpp)."""
    q = row.batch * row.heads * row.len_q * row.head_dim
    kv = row.batch * row.heads * row.len_kv * row.head_dim
    lse = row.batch * row.heads * row.len_q
    factor = 4 if row.pass_ in BACKWARD_PASSES else 2
    return element_bytes(row.dtype) * (factor * q + factor * kv) + 4.0 * lse


def tflops_of(row: Row) -> float:
    return row.tflops if row.tflops else flops(row) / (row.median_ms * 1e-3) / 1e12


def ceiling_name(dtype: str) -> str:
    """The ceiling % of SOL is taken against for this element type (bench/schema.py)."""
    return SOL_CEILING.get(dtype, "fp32_gemm")


def pct_of_ceiling(row: Row, results: Results) -> float | None:
    if row.pct_sol is not None:
        return row.pct_sol
    ceiling = results.ceiling(ceiling_name(row.dtype))
    return 100.0 * tflops_of(row) / ceiling if ceiling else None


# ---- implementations and their look ---------------------------------------------------------

def is_stage(name: str) -> bool:
    return bool(re.match(r"^\d\d_", name))


def impl_order(impl: tuple[str, str]) -> tuple:
    stage, dtype = impl
    if is_stage(stage):
        return (0, stage, dtype)
    rank = BASELINES.index(stage) if stage in BASELINES else len(BASELINES)
    return (1, rank, stage, dtype)


def stage_title(stage: str) -> str:
    """`06_pipelined` -> `06 pipelined`."""
    return stage.replace("_", " ", 1).replace("_", " ") if is_stage(stage) else stage


def impl_label(impl: tuple[str, str], pass_: str = "fwd") -> str:
    stage, dtype = impl
    if is_stage(stage):
        label = stage_title(stage)
        copy = copy_of_forward(stage, pass_)
        if copy:
            label += f" (= {copy[:2]}'s forward)"
        return label
    names = {"torch_flash": "PyTorch flash", "torch_cudnn": "PyTorch cuDNN",
             "torch_eager": "PyTorch eager", "torch_sdpa": "PyTorch SDPA (default)",
             "torch_efficient": "PyTorch efficient", "torch_math": "PyTorch math",
             "cublas_fp32": "cuBLAS eager", "cublas_bf16": "cuBLAS eager"}
    return f"{names.get(stage, stage)} {dtype.upper()}"


# The baselines' short names, where a figure labels a line or a bar in a few letters.
SHORT_NAMES = {"torch_eager": "eager", "torch_flash": "flash", "torch_cudnn": "cuDNN",
               "torch_sdpa": "SDPA", "torch_efficient": "efficient"}


def copy_of_forward(stage: str, pass_: str = "fwd") -> str | None:
    """The later stage whose forward is this stage's code verbatim (06 for 07's), if any: the
    figures draw that kernel once, under the stage that introduced it."""
    if pass_ != "fwd":
        return None
    for copy, original in FORWARD_COPIES.items():
        if original == stage:
            return copy
    return None


def drawn_once(impls, pass_: str = "fwd") -> list:
    """`impls` without the forward copies (07's forward is 06's, 11's is 10's) whose original
    is among them."""
    present = {stage for stage, _ in impls}
    return [impl for impl in impls
            if not (pass_ == "fwd" and FORWARD_COPIES.get(impl[0]) in present)]


# One colour per stage, in families: grey to blue for FP32 (00-04), greens for BF16 mma.sync
# (05-07), warm colours for Hopper (08-12). A backward stage shares its forward's colour.
_STAGE_COLORS = {
    "00": "#8c8c8c", "01": "#8e6cc1", "02": "#4c72b0", "03": "#1b9bd1", "04": "#0b4f8a",
    "05": "#66bb6a", "06": "#2e7d32", "07": "#2e7d32",
    "08": "#f5a623", "09": "#e8590c", "10": "#c2185b", "11": "#c2185b", "12": "#7b1fa2",
}
_STAGE_MARKERS = {"00": "o", "01": "s", "02": "D", "03": "^", "04": "v", "05": "o", "06": "s",
                  "07": "s", "08": "D", "09": "^", "10": "v", "11": "v", "12": "P"}
_BASELINE_STYLE = {  # color, marker, linestyle
    "torch_flash": ("#111111", "x", "--"), "torch_cudnn": ("#b71c1c", "+", "-."),
    "torch_eager": ("#7a7a7a", "3", ":"), "torch_sdpa": ("#a0522d", "x", "--"),
    "torch_efficient": ("#a0522d", "d", "--"), "torch_math": ("#9e9e9e", "2", ":"),
    "cublas_fp32": ("#8d6e63", "s", ":"), "cublas_bf16": ("#8d6e63", "p", ":"),
}


def impl_style(impl: tuple[str, str]) -> dict:
    stage, dtype = impl
    if is_stage(stage):
        return dict(color=_STAGE_COLORS.get(stage[:2], "#555555"), linestyle="-",
                    marker=_STAGE_MARKERS.get(stage[:2], "o"), linewidth=1.8, markersize=5)
    color, marker, linestyle = _BASELINE_STYLE.get(stage, ("#adb5bd", ".", ":"))
    if stage == "torch_eager" and dtype == "fp32":  # drawn beside its BF16 twin in some legends
        color, linestyle = "#4d4d4d", (0, (4, 1.5, 1, 1.5, 1, 1.5))
    return dict(color=color, marker=marker, linewidth=1.3, markersize=6, linestyle=linestyle)


def fp32_sdpa(results: Results) -> str:
    """The PyTorch FP32 SDPA baseline of this run: torch_sdpa (PyTorch's default dispatch)
    where it was measured, else torch_efficient (runs that predate torch_sdpa; in FP32 the
    default dispatch can only choose between the efficient and the math backend)."""
    return "torch_sdpa" if results.ok_rows(stage="torch_sdpa") else "torch_efficient"


def chosen_baselines(results: Results, dtype: str) -> list[tuple[str, str]]:
    """The few baselines a figure draws beside the stages of one element type; every other
    baseline is in the tables."""
    if dtype == "fp32":
        return [(fp32_sdpa(results), "fp32"), ("torch_eager", "fp32")]
    return [("torch_flash", dtype), ("torch_cudnn", dtype), ("torch_eager", dtype)]

# ---- shared figure pieces -------------------------------------------------------------------

def _figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), dpi=DPI)


def _footer(fig: Figure, results: Results, flop_note: bool = True) -> None:
    parts = [FLOP_NOTE] if flop_note else ["Times are medians over timed calls."]
    if results.commits:
        parts.append("commit " + ", ".join(c[:10] for c in results.commits[:3]))
    fig.text(0.01, 0.01, "  ".join(parts), fontsize=7, color="#555555", ha="left", va="bottom")


def _log2_length_axis(ax, lengths) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(lengths))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(v)}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _shape_text(batch, heads, head_dim, len_text="Lq=Lkv=N") -> str:
    return f"B={batch}, H={heads}, d={head_dim}, {len_text}"


def _config_slug(batch, heads, head_dim) -> str:
    return f"b{batch}_h{heads}_d{head_dim}"


def _legend_edge(fig: Figure, inches: float) -> float:
    """The right edge of the axes, in figure coordinates, that leaves `inches` for a legend."""
    return 1.0 - inches / fig.get_figwidth()


def _legend_right(fig: Figure, handles, labels, **kwargs) -> None:
    """A legend in the space right of the axes (see _legend_edge)."""
    right = fig.subplotpars.right
    if handles:
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(right + 0.01, 0.5),
                   fontsize=8, frameon=False, **kwargs)


def _ratio_axis(ax, values) -> None:
    """A log axis of ratios with ticks at 1, 2, 5 times powers of ten, labelled `2×`."""
    low, high = min(values + [1.0]) / 1.3, max(values + [1.0]) * 1.3
    ticks = [m * 10.0 ** e for e in range(-4, 6) for m in (1, 2, 5) if low <= m * 10.0 ** e <= high]
    ax.set_yscale("log")
    ax.set_ylim(low, high)
    ax.set_yticks(ticks)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def seqlen_configs(results: Results, pass_: str = "fwd", min_lengths: int = 3) -> list[tuple]:
    """(batch, heads, head_dim) of every square sweep over sequence length: at least
    `min_lengths` values of N = Lq = Lkv with a measured row."""
    lengths: dict[tuple, set] = {}
    for row in results.ok_rows(pass_=pass_):
        if row.len_q == row.len_kv:
            lengths.setdefault((row.batch, row.heads, row.head_dim), set()).add(row.len_q)
    return sorted((c for c, n in lengths.items() if len(n) >= min_lengths), key=_config_order)


def _config_order(config) -> tuple:
    batch, heads, head_dim = config
    return (head_dim, -batch, heads)


def _series(results: Results, config, causal: bool, pass_: str) -> dict[tuple, list[Row]]:
    batch, heads, head_dim = config
    series: dict[tuple, list[Row]] = {}
    for row in results.ok_rows(batch=batch, heads=heads, head_dim=head_dim, causal=causal,
                               pass_=pass_):
        if row.len_q == row.len_kv:
            series.setdefault(row.impl, []).append(row)
    for rows in series.values():
        rows.sort(key=lambda r: r.len_q)
    return dict(sorted(series.items(), key=lambda item: impl_order(item[0])))


def _causal_panels(results: Results, config, pass_: str = "fwd"):
    panels = []
    for causal in (False, True):
        series = _series(results, config, causal, pass_)
        if series:
            panels.append((causal, series))
    return panels



# ---- data the figures and the notebook share --------------------------------------------------

def headline_shape(dtype: str) -> tuple:
    """(B, H, Lq, Lkv, d, causal) a stage of this element type is judged on."""
    name = "fp32_headline" if dtype == "fp32" else "bf16_headline"
    return HEADLINES[name] + (False,)


def headline_text(shape) -> str:
    batch, heads, len_q, len_kv, head_dim = shape[:5]
    lengths = f"N={len_q}" if len_q == len_kv else f"Lq={len_q}, Lkv={len_kv}"
    return f"B={batch}, H={heads}, {lengths}, d={head_dim}"


def find_row(results: Results, stage: str, dtype: str | None, shape, pass_: str) -> Row | None:
    """The measured row of one implementation at one shape and pass, or None."""
    for row in results.ok_rows(stage=stage, pass_=pass_):
        if row.shape == tuple(shape) and (dtype is None or row.dtype == dtype):
            return row
    return None


def stage_dtype(results: Results, stage: str) -> str | None:
    dtypes = {row.dtype for row in results.rows if row.stage == stage}
    return next(iter(sorted(dtypes))) if dtypes else None


@dataclass
class LadderStep:
    group: str        # "FP32 forward", "BF16 forward", "BF16 backward"
    stage: str
    row: Row
    pct_sol: float | None


LADDER_GROUPS = ["FP32 forward", "BF16 forward", "BF16 backward"]


def ladder(results: Results) -> list[LadderStep]:
    """Every stage at its own headline shape, in course order: the forward passes (a forward
    that is an earlier stage's code verbatim counted once, under that stage), then the
    backward passes."""
    steps = []
    stages = [s for s in STAGES if stage_dtype(results, s)]
    for pass_ in ("fwd", "bwd"):
        for stage in stages:
            if pass_ == "fwd" and FORWARD_COPIES.get(stage) in stages:
                continue
            dtype = stage_dtype(results, stage)
            row = find_row(results, stage, dtype, headline_shape(dtype), pass_)
            if row:
                group = f"{'FP32' if dtype == 'fp32' else 'BF16'} " + \
                    ("forward" if pass_ == "fwd" else "backward")
                steps.append(LadderStep(group, stage, row, pct_of_ceiling(row, results)))
    return steps


@dataclass
class ChapterGain:
    stage: str
    pass_: str
    reference: tuple[str, str]  # (implementation, dtype) the stage is measured against
    headline: str               # "fp32_headline" or "bf16_headline"
    row: Row
    reference_row: Row

    @property
    def speedup(self) -> float:
        return self.reference_row.median_ms / self.row.median_ms


def chapter_references(results: Results) -> list[tuple[str, str, tuple[str, str]]]:
    """(stage, pass, reference) per chapter after the first. A stage with a backward pass is
    measured on it, against the previous stage's backward (11 against 07), or, for the first
    backward stage, against PyTorch's eager backward (what one has without a fused backward).
    Any other stage is measured on its forward, against the previous stage that brought its own
    forward kernel (08 against 06, since 07's forward is 06's)."""
    stages = [s for s in STAGES if stage_dtype(results, s)]
    references = []
    for index, stage in enumerate(stages[1:], 1):
        earlier = stages[:index]
        dtype = stage_dtype(results, stage)
        if results.ok_rows(stage=stage, pass_="bwd"):
            backward = [s for s in earlier if results.ok_rows(stage=s, pass_="bwd")]
            reference = (backward[-1], stage_dtype(results, backward[-1])) if backward else \
                ("torch_eager", dtype)
            references.append((stage, "bwd", reference))
        else:
            forward = [s for s in earlier if s not in FORWARD_COPIES]
            references.append((stage, "fwd", (forward[-1], stage_dtype(results, forward[-1]))))
    return references


def chapter_gains(results: Results) -> list[ChapterGain]:
    gains = []
    for stage, pass_, reference in chapter_references(results):
        for headline in ("fp32_headline", "bf16_headline"):
            shape = HEADLINES[headline] + (False,)
            row = find_row(results, stage, stage_dtype(results, stage), shape, pass_)
            reference_row = find_row(results, reference[0], reference[1], shape, pass_)
            if row and reference_row:
                gains.append(ChapterGain(stage, pass_, reference, headline, row, reference_row))
    return gains


def versus(results: Results, stage: str, baseline: str, shape, pass_: str) -> float | None:
    """How many times faster `stage` is than `baseline` (same dtype) at one shape and pass."""
    dtype = stage_dtype(results, stage)
    row = find_row(results, stage, dtype, shape, pass_)
    other = find_row(results, baseline, dtype, shape, pass_)
    return other.median_ms / row.median_ms if row and other else None


def sdpa_config(results: Results) -> tuple | None:
    """The (B, H, d) of the seqlen sweep the FP32 SDPA comparison uses (after SDPA_ARTICLE):
    d = 64 where there is one."""
    configs = seqlen_configs(results)
    return next((c for c in configs if c[2] == 64), configs[0] if configs else None)


def fp32_sdpa_sweep(results: Results, stage: str = "04_warp_shuffle") -> list[tuple]:
    """(N, SDPA ms, stage ms, speedup) over the non-causal seqlen sweep at sdpa_config."""
    config = sdpa_config(results)
    if not config:
        return []
    series = _series(results, config, False, "fwd")
    sdpa = {r.len_q: r.median_ms for r in series.get((fp32_sdpa(results), "fp32"), [])}
    ours = {r.len_q: r.median_ms for r in series.get((stage, "fp32"), [])}
    return [(n, sdpa[n], ours[n], sdpa[n] / ours[n]) for n in sorted(set(sdpa) & set(ours))]


def markdown_table(header, lines) -> str:
    rows = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i else "---"
                                                          for i in range(len(header))) + "|"]
    rows += ["| " + " | ".join(str(cell) for cell in line) + " |" for line in lines]
    return "\n".join(rows)


# ---- (1) the ladder -------------------------------------------------------------------------

def _tick_label(stage: str, width: int = 10) -> str:
    number, _, name = stage.partition("_")
    return number + "\n" + textwrap.fill(name.replace("_", " "), width, break_long_words=False)


def ladder_figure(results: Results) -> dict[str, Figure]:
    """TFLOP/s of every stage at its headline shape, in course order, on a log axis; the
    measured GEMM ceilings and PyTorch's fused attention as reference lines over each group;
    % of SOL printed in the bars."""
    steps = ladder(results)
    if not steps:
        raise NoData("no stage measured at its headline shape")
    groups = [g for g in LADDER_GROUPS if any(s.group == g for s in steps)]
    fig = _figure(13.5, 6.2)
    fig.subplots_adjust(left=0.06, right=_legend_edge(fig, 3.0), bottom=0.2, top=0.8)
    ax = fig.subplots()
    positions, x = [], 0.0
    spans = {}
    for group in groups:
        first = x
        for step in [s for s in steps if s.group == group]:
            positions.append((x, step))
            x += 1.0
        spans[group] = (first - 0.5, x - 0.5)
        x += 0.6
    values = [s.row.tflops or tflops_of(s.row) for _, s in positions]
    first_bar = {}  # the height of each group's first bar, which a line's label must clear
    for (_, step), value in zip(positions, values):
        first_bar.setdefault(step.group, value)
    references = []  # (group, label, value, style, short name or None)
    for group in groups:
        dtype = "fp32" if group.startswith("FP32") else "bf16"
        pass_ = "bwd" if group.endswith("backward") else "fwd"
        shape = headline_shape(dtype)
        ceiling = results.ceiling(SOL_CEILING[dtype])
        if ceiling:
            # A wide pale band, not a line: at the BF16 headline cuDNN's line lies within a few
            # per cent of the ceiling, and the two must stay apart where they overlap.
            references.append((group, "measured cuBLAS GEMM ceiling of the\nelement type "
                               "(= 100% of SOL)", ceiling,
                               dict(color="#7fa7c9", linestyle="-", linewidth=6.0, alpha=0.6,
                                    solid_capstyle="butt", zorder=1.5), None))
        sdpa = fp32_sdpa(results)
        names = [sdpa] if dtype == "fp32" else ["torch_flash", "torch_cudnn"]
        for name in names:
            row = find_row(results, name, dtype, shape, pass_)
            if row:
                style = impl_style((name, dtype))
                references.append((group, impl_label((name, dtype)), tflops_of(row),
                                   dict(color=style["color"], linestyle=style["linestyle"],
                                        linewidth=1.4),
                                   "SDPA" if name == sdpa else SHORT_NAMES.get(name, name)))
    low = min(values) / 2.5
    high = max(values + [v for _, _, v, _, _ in references]) * 2.0
    ax.set_yscale("log")
    ax.set_ylim(low, high)
    for index, group in enumerate(groups):
        left, right = spans[group]
        if index % 2:
            ax.axvspan(left - 0.3, right + 0.3, color="#f3f3f3", zorder=0)
        dtype = "fp32" if group.startswith("FP32") else "bf16"
        ax.text((left + right) / 2, 1.015, f"{group}\n{headline_text(headline_shape(dtype))}",
                transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=9)
    legend = {}
    for group, label, value, style, short in references:
        left, right = spans[group]
        style = dict(dict(zorder=2), **style)
        (line,) = ax.plot([left - 0.1, right + 0.1], [value, value], **style)
        if label.startswith("measured"):  # the ceiling's value, named, above its band
            ax.text(left - 0.1, value * 1.1, f"GEMM ceiling {value:.3g}", ha="left",
                    va="bottom", fontsize=7.5, color="#3d6a91", zorder=5)
        else:
            # Each baseline's name and value at the group's left end, so that a line lying close
            # to the ceiling's band (cuDNN at the BF16 headline) can be told from it without the
            # legend; below the line unless the group's first bar reaches up to it.
            above = first_bar[group] > value / 1.7
            ax.text(left - 0.1, value * (1.06 if above else 1 / 1.06), f"{short} {value:.3g}",
                    ha="left", va="bottom" if above else "top", fontsize=7.5,
                    color=style["color"], zorder=5,
                    bbox=dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none",
                              alpha=0.8))
        legend.setdefault(label, line)
    for (x, step), value in zip(positions, values):
        color = _STAGE_COLORS.get(step.stage[:2], "#555555")
        backward = step.group.endswith("backward")
        ax.bar(x, value - low, bottom=low, width=0.72, color=color, zorder=3,
               hatch="///" if backward else None, edgecolor="white" if backward else color,
               linewidth=0)
        # On the bar's own colour, so that the hatching of a backward bar does not cross it.
        box = dict(boxstyle="square,pad=0.15", facecolor=color, edgecolor="none")
        ax.text(x, value / 1.2, f"{value:.3g}", ha="center", va="top", fontsize=8.5,
                color="white", fontweight="bold", zorder=5, bbox=box)
        if step.pct_sol is not None:
            ax.text(x, low * 1.12, f"{step.pct_sol:.0f}%", ha="center", va="bottom",
                    fontsize=8, color="white", zorder=5, bbox=box)
    labels = []
    for _, step in positions:
        label = _tick_label(step.stage)
        copy = copy_of_forward(step.stage, "bwd" if step.group.endswith("backward") else "fwd")
        if copy:
            label += f"\n(= {copy[:2]} fwd)"
        labels.append(label)
    ax.set_xticks([x for x, _ in positions], labels, fontsize=8)
    ax.set_xlim(-0.8, x_end if (x_end := positions[-1][0] + 0.8) else 1)
    ax.set_ylabel("TFLOP/s (log scale)")
    ax.grid(True, axis="y", which="major", alpha=0.3)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    handles = list(legend.values()) + [
        Patch(facecolor="#777777", label="forward"),
        Patch(facecolor="#777777", hatch="///", edgecolor="white", label="backward")]
    labels = list(legend.keys()) + ["forward pass", "backward pass"]
    _legend_right(fig, handles, labels, title="in each bar: TFLOP/s (top),\n% of SOL (bottom)",
                  title_fontsize=8.5)
    fig.suptitle(f"The course's ladder: each stage at its headline shape — {results.gpu}\n"
                 f"the TFLOP/s and % of SOL table of {SOL_ARTICLE}, extended to every stage "
                 "of the course",
                 fontsize=11)
    _footer(fig, results)
    return {"ladder": fig}


# ---- (2) what each chapter bought -----------------------------------------------------------

def chapter_speedup_figure(results: Results) -> dict[str, Figure]:
    """Each chapter's stage over the stage before it (chapter_references says which), at both
    headline shapes; one pair of bars per chapter, log axis."""
    gains = chapter_gains(results)
    if not gains:
        raise NoData("no chapter with both its stage and its reference measured")
    chapters = []
    for gain in gains:
        if gain.stage not in chapters:
            chapters.append(gain.stage)
    fig = _figure(13.5, 5.6)
    fig.subplots_adjust(left=0.06, right=_legend_edge(fig, 2.9), bottom=0.24, top=0.83)
    ax = fig.subplots()
    colors = {"fp32_headline": "#4c72b0", "bf16_headline": "#dd8452"}
    width = 0.38
    speedups = [g.speedup for g in gains]
    for gain in gains:
        x = chapters.index(gain.stage) + (-width / 2 if gain.headline == "fp32_headline" else
                                          width / 2)
        hatch = "///" if gain.pass_ == "bwd" else None
        ax.bar(x, gain.speedup - 1, bottom=1, width=width, color=colors[gain.headline],
               hatch=hatch, edgecolor="white" if hatch else colors[gain.headline], linewidth=0)
        above = gain.speedup >= 1
        ax.text(x, gain.speedup * (1.04 if above else 0.96), f"{gain.speedup:.2f}×",
                ha="center", va="bottom" if above else "top", fontsize=7.5, rotation=90)
    ax.set_yscale("log", base=2)
    ax.set_ylim(min(speedups + [1]) / 1.6, max(speedups) * 2.2)
    ax.axhline(1.0, color="#333333", linewidth=0.9)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.grid(True, axis="y", which="major", alpha=0.3)
    labels = []
    for stage, pass_, reference in chapter_references(results):
        if stage not in chapters:
            continue
        against = reference[0][:2] if is_stage(reference[0]) else impl_label(reference)
        what = "backward" if pass_ == "bwd" else "forward"
        labels.append(f"{_tick_label(stage, 11)}\n{what} over\n" + textwrap.fill(against, 11))
    ax.set_xticks(range(len(chapters)), labels, fontsize=7.5)
    ax.set_xlim(-0.6, len(chapters) - 0.4)
    ax.set_ylabel("speedup over the reference (×, log scale)")
    handles = [Patch(facecolor=colors[h], label=h) for h in colors] + [
        Patch(facecolor="#777777", hatch="///", edgecolor="white")]
    labels = [f"FP32 headline:\n{headline_text(HEADLINES['fp32_headline'])}",
              f"BF16 headline:\n{headline_text(HEADLINES['bf16_headline'])}",
              "hatched: backward pass"]
    _legend_right(fig, handles, labels, labelspacing=1.0)
    fig.suptitle(f"What each chapter bought: the reference's median time over its stage's — "
                 f"{results.gpu}\nthe course's own story, not a source text's: a forward over the "
                 "previous forward kernel (08 over 06: 07's forward is 06's),\na backward over the "
                 "previous backward (07 over PyTorch eager's backward)",
                 fontsize=10.5)
    _footer(fig, results, flop_note=False)
    return {"chapter_speedup": fig}


# ---- (3) the FP32 stages against PyTorch's FP32 SDPA (SDPA_ARTICLE's comparison) -----------

def fp32_vs_sdpa_figure(results: Results) -> dict[str, Figure]:
    """The FP32 stages' forward time against N beside PyTorch's FP32 SDPA and eager attention,
    and each stage's speedup over that SDPA (non-causal, the d=64 configuration)."""
    config = sdpa_config(results)
    series = _series(results, config, False, "fwd") if config else {}
    stages = [impl for impl in series if is_stage(impl[0]) and impl[1] == "fp32"]
    if not stages:
        raise NoData("no FP32 stage in a sweep over sequence length")
    sdpa = (fp32_sdpa(results), "fp32")
    baselines = [b for b in chosen_baselines(results, "fp32") if series.get(b)]
    has_sdpa = bool(series.get(sdpa))
    fig = _figure(12.6 if has_sdpa else 8.4, 5.6)
    fig.subplots_adjust(left=0.85 / fig.get_figwidth(), right=_legend_edge(fig, 2.6),
                        bottom=0.14, top=0.82, wspace=0.25)
    axes = fig.subplots(1, 2 if has_sdpa else 1, squeeze=False)[0]
    legend = {}
    lengths = set()
    for impl in stages + baselines:
        rows = series[impl]
        lengths.update(r.len_q for r in rows)
        (line,) = axes[0].plot([r.len_q for r in rows], [r.median_ms for r in rows],
                               **impl_style(impl))
        legend.setdefault(impl_label(impl), line)
    axes[0].set_yscale("log")
    _log2_length_axis(axes[0], lengths)
    axes[0].set_ylabel("forward time (ms, log scale)")
    axes[0].set_title("forward time", fontsize=10)
    if has_sdpa:
        reference = {r.len_q: r.median_ms for r in series[sdpa]}
        ax = axes[1]
        ratios = []
        for impl in stages:
            points = [(r.len_q, reference[r.len_q] / r.median_ms) for r in series[impl]
                      if r.len_q in reference]
            if points:
                ax.plot(*zip(*points), **impl_style(impl))
                ratios += [y for _, y in points]
        ax.axhline(1.0, color=impl_style(sdpa)["color"], linestyle="--", linewidth=1.2)
        _ratio_axis(ax, ratios)
        _log2_length_axis(ax, reference)
        ax.set_ylabel("speedup over PyTorch's FP32 SDPA (×, log scale)")
        ax.set_title(f"speedup over {impl_label(sdpa)} (dashed line: 1×)", fontsize=10)
    for ax in axes:
        ax.grid(True, which="both", alpha=0.25)
        ax.set_xlabel("sequence length N (Lq = Lkv)")
    note = ("" if sdpa[0] == "torch_sdpa" else
            "\nthis run has no torch_sdpa (default dispatch) rows: its efficient backend stands "
            "in, the only fused one that takes FP32")
    if not has_sdpa:
        note = "\nno PyTorch FP32 SDPA rows in this run (PyTorch was not importable)"
    _legend_right(fig, list(legend.values()), list(legend.keys()))
    fig.suptitle(f"The FP32 stages against PyTorch's FP32 SDPA — {results.gpu}\n"
                 f"the comparison of {SDPA_ARTICLE}\n{_shape_text(*config)}, non-causal{note}",
                 fontsize=10.5)
    _footer(fig, results, flop_note=False)
    return {"fp32_vs_sdpa": fig}


# ---- (4) runtime vs sequence length ---------------------------------------------------------

def runtime_vs_seqlen(results: Results) -> dict[str, Figure]:
    """Forward time against N, log-log: FP32 stages (left) and BF16 stages (right), each with
    its few chosen baselines, non-causal (top) and causal (bottom); one figure per (B, H, d)."""
    configs = seqlen_configs(results)
    if not configs:
        raise NoData("no forward sweep over sequence length (need 3+ lengths of one B, H, d)")
    figures = {}
    for config in configs:
        panels = []
        for causal, series in _causal_panels(results, config):
            for dtype in ("fp32", "bf16"):
                stages = drawn_once([i for i in series if is_stage(i[0]) and i[1] == dtype])
                if stages:
                    chosen = stages + [b for b in chosen_baselines(results, dtype) if series.get(b)]
                    panels.append((causal, dtype, [(i, series[i]) for i in chosen]))
        causals = sorted({p[0] for p in panels})
        dtypes = [d for d in ("fp32", "bf16") if any(p[1] == d for p in panels)]
        fig = _figure(5.0 * len(dtypes) + 3.0, 1.4 + 3.9 * len(causals))
        fig.subplots_adjust(left=0.8 / fig.get_figwidth(), right=_legend_edge(fig, 2.9),
                            bottom=0.75 / fig.get_figheight(), top=1 - 1.0 / fig.get_figheight(),
                            wspace=0.22, hspace=0.3)
        grid = fig.subplots(len(causals), len(dtypes), sharey="col", squeeze=False)
        legend = {}
        for causal, dtype, lines in panels:
            ax = grid[causals.index(causal)][dtypes.index(dtype)]
            lengths = set()
            for impl, rows in lines:
                xs = [r.len_q for r in rows]
                lengths.update(xs)
                (line,) = ax.plot(xs, [r.median_ms for r in rows], **impl_style(impl))
                legend.setdefault(impl, line)
            ax.set_yscale("log")
            _log2_length_axis(ax, lengths)
            ax.grid(True, which="both", alpha=0.25)
            ax.set_title(f"{dtype.upper()} stages, {'causal' if causal else 'non-causal'}",
                         fontsize=10)
            if causals.index(causal) == len(causals) - 1:
                ax.set_xlabel("sequence length N (Lq = Lkv)")
            ax.set_ylabel("forward time (ms, log scale)")
        ordered = sorted(legend, key=impl_order)
        _legend_right(fig, [legend[i] for i in ordered], [impl_label(i) for i in ordered])
        fig.suptitle(f"Forward time against sequence length — {results.gpu}\n"
                     f"{_shape_text(*config)}; the runtime plot of {RTX4050_REPOSITORY}, the "
                     "stages with PyTorch's flash, cuDNN and eager attention", fontsize=10.5)
        _footer(fig, results, flop_note=False)
        figures[f"runtime_{_config_slug(*config)}"] = fig
    return figures


# ---- (5) speedup over the naive stage -------------------------------------------------------

def speedup_over_naive(results: Results) -> dict[str, Figure]:
    """Naive forward time over each stage's (and PyTorch flash's and cuDNN's), at every N where
    both ran; non-causal and causal side by side."""
    configs = [c for c in seqlen_configs(results)
               if any(_series(results, c, causal, "fwd").get((NAIVE, "fp32"))
                      for causal in (False, True))]
    if not configs:
        raise NoData(f"no {NAIVE} rows in a sweep over sequence length")
    figures = {}
    for config in configs:
        panels = []
        for causal, series in _causal_panels(results, config):
            naive = {r.len_q: r.median_ms for r in series.get((NAIVE, "fp32"), [])}
            if naive:
                panels.append((causal, series, naive))
        fig = _figure(5.6 * len(panels) + 2.9, 5.4)
        fig.subplots_adjust(left=0.8 / fig.get_figwidth(), right=_legend_edge(fig, 2.8),
                            bottom=0.14, top=0.86, wspace=0.12)
        axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
        legend = {}
        for ax, (causal, series, naive) in zip(axes, panels):
            stages = drawn_once([i for i in series if is_stage(i[0]) and i[0] != NAIVE])
            chosen = stages + [b for b in (("torch_flash", "bf16"), ("torch_cudnn", "bf16"))
                               if series.get(b)]
            for impl in chosen:
                points = [(r.len_q, naive[r.len_q] / r.median_ms) for r in series[impl]
                          if r.len_q in naive]
                if points:
                    (line,) = ax.plot(*zip(*points), **impl_style(impl))
                    legend.setdefault(impl, line)
            ax.axhline(1.0, color="#444444", linewidth=0.9)
            _log2_length_axis(ax, naive)
            ax.set_xlabel("sequence length N (Lq = Lkv)")
            ax.set_title("causal" if causal else "non-causal", fontsize=10)
            ax.grid(True, which="both", alpha=0.25)
        _ratio_axis(axes[0], [float(y) for ax in axes for line in ax.get_lines()
                              for y in line.get_ydata()])
        axes[0].set_ylabel(f"speedup over {stage_title(NAIVE)} (×, log scale)")
        ordered = sorted(legend, key=impl_order)
        _legend_right(fig, [legend[i] for i in ordered], [impl_label(i) for i in ordered])
        fig.suptitle(f"Forward speedup over {stage_title(NAIVE)} — {results.gpu}\n"
                     f"{_shape_text(*config)}; the speedup plot of {RTX4050_REPOSITORY}; "
                     "ratio of median times of one run", fontsize=10.5)
        _footer(fig, results, flop_note=False)
        figures[f"speedup_{_config_slug(*config)}"] = fig
    return figures


# ---- (6) forward and backward time: eager, the course's best, flash, cuDNN ------------------

def _fastest(series: dict[tuple, list[Row]], candidates) -> tuple | None:
    """The candidate with the lowest geometric-mean time over the lengths all of them ran."""
    candidates = [c for c in candidates if series.get(c)]
    if not candidates:
        return None
    common = set.intersection(*({r.len_q for r in series[c]} for c in candidates))
    if not common:
        return max(candidates, key=lambda c: len(series[c]))

    def score(impl):
        times = [r.median_ms for r in series[impl] if r.len_q in common]
        return sum(math.log(t) for t in times) / len(times)
    return min(candidates, key=score)


def forward_backward_vs_seqlen(results: Results) -> dict[str, Figure]:
    """PALLAS_ARTICLE's figure: forward and backward time against N for PyTorch eager (the unfused
    reference), the course's fastest BF16 stage of that pass, PyTorch flash and cuDNN."""
    figures = {}
    configs = sorted(set(seqlen_configs(results, "fwd")) | set(seqlen_configs(results, "bwd")),
                     key=_config_order)
    for config in configs:
        cells = []
        for causal in (False, True):
            for pass_ in ("fwd", "bwd"):
                series = _series(results, config, causal, pass_)
                stages = drawn_once([i for i in series if is_stage(i[0]) and i[1] == "bf16"],
                                    pass_)
                best = _fastest(series, stages)
                if not best:
                    continue
                roles = [(SHORT_NAMES["torch_eager"], ("torch_eager", "bf16")), ("course best", best),
                         (SHORT_NAMES["torch_flash"], ("torch_flash", "bf16")),
                         (SHORT_NAMES["torch_cudnn"], ("torch_cudnn", "bf16"))]
                cells.append((causal, pass_, [(role, impl, series[impl]) for role, impl in roles
                                              if series.get(impl)]))
        if not cells:
            print(f"plots: skip fwd_bwd_{_config_slug(*config)}: no BF16 stage in this sweep")
            continue
        causals = sorted({c for c, _, _ in cells})
        passes = [p for p in ("fwd", "bwd") if any(p == q for _, q, _ in cells)]
        fig = _figure(5.0 * len(passes) + 3.0, 1.4 + 3.7 * len(causals))
        fig.subplots_adjust(left=0.8 / fig.get_figwidth(), right=_legend_edge(fig, 3.0),
                            bottom=0.75 / fig.get_figheight(), top=1 - 1.0 / fig.get_figheight(),
                            wspace=0.22, hspace=0.32)
        grid = fig.subplots(len(causals), len(passes), squeeze=False)
        legend = {}
        for causal, pass_, lines in cells:
            ax = grid[causals.index(causal)][passes.index(pass_)]
            lengths = set()
            for role, impl, rows in lines:
                xs = [r.len_q for r in rows]
                lengths.update(xs)
                label = impl_label(impl, pass_) if role != "course best" else \
                    f"course best: {impl_label(impl, pass_)}"
                (line,) = ax.plot(xs, [r.median_ms for r in rows], **impl_style(impl))
                legend.setdefault(label, line)
            ax.set_yscale("log")
            _log2_length_axis(ax, lengths)
            ax.grid(True, which="both", alpha=0.25)
            ax.set_title(f"{'forward' if pass_ == 'fwd' else 'backward'}, "
                         f"{'causal' if causal else 'non-causal'}", fontsize=10)
            if causals.index(causal) == len(causals) - 1:
                ax.set_xlabel("sequence length N (Lq = Lkv)")
            ax.set_ylabel("time (ms, log scale)")
        for row in grid:
            for ax in row:
                if not ax.has_data():
                    ax.set_axis_off()
        fig.suptitle(f"Forward and backward time against sequence length — {results.gpu}\n"
                     f"{_shape_text(*config)}, BF16; the forward/backward figure of "
                     f"{PALLAS_ARTICLE}:\neager, the course's fastest stage of the pass, flash, "
                     "cuDNN", fontsize=10.5)
        _legend_right(fig, list(legend.values()), list(legend.keys()))
        _footer(fig, results, flop_note=False)
        figures[f"fwd_bwd_{_config_slug(*config)}"] = fig
    if not figures:
        raise NoData("no sweep over sequence length with a BF16 stage")
    return figures



# ---- (6b) the Hopper stages as a ratio to FlashAttention-2 and cuDNN -------------------------

HOPPER_FIRST = "08"  # the first stage that needs sm_90a
RATIO_BASELINES = [("torch_flash", "FlashAttention-2 (PyTorch flash)"),
                   ("torch_cudnn", "cuDNN (PyTorch cuDNN)")]
_RATIO_TICKS = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0]
# Above this the figure is cut: at the shortest lengths the baselines' fixed costs dominate and
# ratios of 4 to 8 would squeeze the range where the stages and the baselines meet.
RATIO_TOP = 3.0


def hopper_ratio_lines(results: Results, config, causal: bool, baseline: str) -> list[tuple]:
    """(impl, pass, [(N, baseline time / stage time)]) for the Hopper stages' forward passes
    (08 on, each timed kernel, 11's copy of 10's forward included) and every BF16 backward
    (07's and 11's). A ratio is taken only between two rows of one run: same GPU, same commit."""
    lines = []
    for pass_ in ("fwd", "bwd"):
        series = _series(results, config, causal, pass_)
        reference = {r.len_q: r for r in series.get((baseline, "bf16"), [])}
        for impl, rows in series.items():
            stage, dtype = impl
            if not is_stage(stage) or dtype != "bf16":
                continue
            if pass_ == "fwd" and stage[:2] < HOPPER_FIRST:
                continue
            points = [(r.len_q, reference[r.len_q].median_ms / r.median_ms) for r in rows
                      if r.len_q in reference and reference[r.len_q].commit == r.commit
                      and reference[r.len_q].gpu == r.gpu]
            if points:
                lines.append((impl, pass_, points))
    return lines


def _ratio_style(impl: tuple[str, str], pass_: str) -> dict:
    """Forward solid; a forward that is an earlier stage's code (11's = 10's) dotted with hollow
    markers; backward dashed."""
    style = impl_style(impl)
    if pass_ == "bwd":
        style.update(linestyle="--")
    elif FORWARD_COPIES.get(impl[0]):
        style.update(linestyle=":", markerfacecolor="white")
    return style


def _ratio_label(impl: tuple[str, str], pass_: str) -> str:
    copy = FORWARD_COPIES.get(impl[0]) if pass_ == "fwd" else None
    what = "backward pass" if pass_ == "bwd" else "forward pass"
    return f"{stage_title(impl[0])}, {what}" + (f"\n(= {copy[:2]}'s code)" if copy else "")


def hopper_ratio_figure(results: Results) -> dict[str, Figure]:
    """Each Hopper stage's speed over FlashAttention-2's (top) and cuDNN's (bottom) against N,
    for every seqlen configuration, non-causal and causal: the ratios the log-time plots hide."""
    columns = []
    for config in seqlen_configs(results):
        for causal in (False, True):
            if any(hopper_ratio_lines(results, config, causal, b) for b, _ in RATIO_BASELINES):
                columns.append((config, causal))
    baselines = [(b, title) for b, title in RATIO_BASELINES
                 if any(hopper_ratio_lines(results, c, k, b) for c, k in columns)]
    if not columns or not baselines:
        raise NoData("no Hopper stage and PyTorch flash or cuDNN rows of one run in a sweep "
                     "over sequence length")
    fig = _figure(3.6 * len(columns) + 3.3, 1.8 + 3.8 * len(baselines))
    fig.subplots_adjust(left=1.0 / fig.get_figwidth(), right=_legend_edge(fig, 2.7),
                        bottom=0.75 / fig.get_figheight(), top=1 - 1.25 / fig.get_figheight(),
                        wspace=0.12, hspace=0.3)
    grid = fig.subplots(len(baselines), len(columns), sharey=True, squeeze=False)
    legend, values, clipped = {}, [], 0
    for row_index, (baseline, title) in enumerate(baselines):
        for column_index, (config, causal) in enumerate(columns):
            ax = grid[row_index][column_index]
            lengths = set()
            for impl, pass_, points in hopper_ratio_lines(results, config, causal, baseline):
                lengths.update(n for n, _ in points)
                values += [v for _, v in points]
                clipped = max([clipped] + [v for _, v in points if v > RATIO_TOP * 1.05])
                (line,) = ax.plot(*zip(*points), **_ratio_style(impl, pass_))
                legend.setdefault((int(pass_ == "bwd"), impl_order(impl)),
                                  (line, _ratio_label(impl, pass_)))
            style = impl_style((baseline, "bf16"))
            one = ax.axhline(1.0, color=style["color"], linewidth=1.2, linestyle=style["linestyle"])
            legend.setdefault((2, row_index), (one, f"1× = {title}"))
            if lengths:
                _log2_length_axis(ax, lengths)
            ax.tick_params(axis="x", labelsize=7.5)
            ax.grid(True, which="major", alpha=0.3)
            batch, heads, head_dim = config
            if row_index == 0:
                ax.set_title(f"d={head_dim} (B={batch}, H={heads}), "
                             f"{'causal' if causal else 'non-causal'}", fontsize=9.5)
            if row_index == len(baselines) - 1:
                ax.set_xlabel("sequence length N (Lq = Lkv)")
            if column_index == 0:
                ax.set_ylabel(f"over {title.split(' (')[0]}\n(× its speed, log scale)", fontsize=9.5)
    low, high = min(values + [1.0]) / 1.12, min(max(values + [1.0]) * 1.12, RATIO_TOP * 1.05)
    axis = grid[0][0]
    axis.set_yscale("log")
    axis.set_ylim(low, high)
    axis.set_yticks([t for t in _RATIO_TICKS if low <= t <= high])
    axis.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    axis.yaxis.set_minor_formatter(NullFormatter())
    axis.yaxis.set_minor_locator(NullLocator())
    ordered = [legend[key] for key in sorted(legend)]
    _legend_right(fig, [h for h, _ in ordered], [label for _, label in ordered], labelspacing=0.8)
    fig.suptitle(f"The Hopper stages against FlashAttention-2 and cuDNN — {results.gpu}\n"
                 "speed ratio = the baseline's median time / the stage's, both rows from one run; "
                 "above the baseline's line (1×) the stage is faster;\nsolid: forward, dashed: "
                 "backward (07's and 11's against the baseline's backward)" +
                 (f"\ncut at {RATIO_TOP:g}×: the shortest lengths, where the baselines' fixed "
                  f"costs dominate, reach {clipped:.1f}×" if clipped else ""), fontsize=10.5)
    _footer(fig, results, flop_note=False)
    return {"hopper_ratio": fig}


# ---- (5) roofline ---------------------------------------------------------------------------

def _roofline_rows(results: Results, pass_: str) -> list[Row]:
    """The non-causal shape with the most implementations measured, the BF16 headline first;
    the stages (each kernel once) and the chosen baselines."""
    by_shape: dict[tuple, list[Row]] = {}
    for row in results.ok_rows(pass_=pass_, causal=False):
        by_shape.setdefault(row.shape, []).append(row)
    if not by_shape:
        return []
    headline = HEADLINES["bf16_headline"] + (False,)
    if len(by_shape.get(headline, [])) >= 2:
        rows = by_shape[headline]
    else:
        rows = max(by_shape.values(), key=lambda rs: (len(rs), rs[0].len_q * rs[0].len_kv,
                                                       rs[0].shape))
    stages = drawn_once([r.impl for r in rows if is_stage(r.stage)], pass_)
    chosen = set(stages) | {b for d in ("fp32", "bf16") for b in chosen_baselines(results, d)}
    return sorted((r for r in rows if r.impl in chosen), key=lambda r: impl_order(r.impl))


def roofline(results: Results) -> dict[str, Figure]:
    """Measured roofs (cuBLAS GEMM and mma.sync TFLOP/s, device copy GB/s) and every
    implementation at its minimum-traffic arithmetic intensity, for the forward and the backward
    pass."""
    copy = results.ceiling("copy")
    peaks = [(n, results.ceiling(n)) for n in ("bf16_gemm", "bf16_mma_sync", "fp32_gemm")
             if results.ceiling(n)]
    if not copy or not peaks:
        raise NoData("ceilings.csv lacks the copy bandwidth or a GEMM ceiling")
    panels = [(p, _roofline_rows(results, p)) for p in ("fwd", "bwd")]
    panels = [(p, rows) for p, rows in panels if rows]
    if not panels:
        raise NoData("no measured rows")
    fig = _figure(6.0 * len(panels) + 2.8, 5.8)
    fig.subplots_adjust(left=0.85 / fig.get_figwidth(), right=_legend_edge(fig, 2.5),
                        bottom=0.15, top=0.86, wspace=0.2)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    legend = {}
    bandwidth_tb = copy / 1000.0  # GB/s -> TB/s: TFLOP/s per FLOP/byte
    for ax, (pass_, rows) in zip(axes, panels):
        intensities = []
        for row in rows:
            ai = flops(row) / min_bytes(row)
            intensities.append(ai)
            style = impl_style(row.impl)
            point = ax.plot([ai], [tflops_of(row)], linestyle="none", marker=style["marker"],
                            color=style["color"], markersize=7, markeredgewidth=1.5)[0]
            legend.setdefault(impl_label(row.impl), point)
            if row.workspace_bytes:
                # The workspace (the score matrix) is written and read at least once each.
                traffic_ai = flops(row) / (min_bytes(row) + 2.0 * row.workspace_bytes)
                intensities.append(traffic_ai)
                ax.plot([traffic_ai], [tflops_of(row)], linestyle="none", marker="o",
                        markerfacecolor="none", color=style["color"], markersize=8)
                ax.annotate("", xy=(traffic_ai, tflops_of(row)), xytext=(ai, tflops_of(row)),
                            arrowprops=dict(arrowstyle="->", color=style["color"], lw=0.8))
        low, high = min(intensities) / 4, max(intensities) * 4
        ridge = [peak / bandwidth_tb for _, peak in peaks]
        low, high = min([low] + [r / 4 for r in ridge]), max([high] + [r * 4 for r in ridge])
        xs = [low * (high / low) ** (i / 200) for i in range(201)]
        for name, peak in peaks:
            roof = [min(peak, x * bandwidth_tb) for x in xs]
            dashed = name != "bf16_gemm"
            ax.plot(xs, roof, color="#222222", linewidth=1.0 if dashed else 1.8,
                    linestyle="--" if dashed else "-")
            below = name == "bf16_mma_sync"  # close under bf16_gemm: label under its roof
            ax.text(peak / bandwidth_tb * 1.15, peak * (0.92 if below else 1.08),
                    f"{name}: {peak:.4g} TFLOP/s", ha="left", va="top" if below else "bottom",
                    fontsize=7.5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(low, high)
        floor = min(tflops_of(r) for r in rows)
        ax.set_ylim(min(floor / 3, low * bandwidth_tb), max(p for _, p in peaks) * 2.5)
        ax.set_xlabel("arithmetic intensity (FLOP / byte of minimum traffic)")
        ax.set_ylabel("TFLOP/s (log scale)")
        ax.grid(True, which="both", alpha=0.2)
        b, h, lq, lkv, d, _ = rows[0].shape
        ax.set_title(f"{'forward' if pass_ == 'fwd' else 'backward'}: "
                     f"B={b}, H={h}, Lq={lq}, Lkv={lkv}, d={d}, non-causal", fontsize=9.5)
    handles = list(legend.values()) + [
        Line2D([], [], color="#222222", linewidth=1.8, label="measured roof"),
        Line2D([], [], linestyle="none", marker="o", markerfacecolor="none", color="#555555",
               label="counting the workspace\nwritten + read once")]
    labels = list(legend.keys()) + [f"roof: min(GEMM ceiling, AI × copy\nbandwidth {copy:.4g} GB/s)",
                                    "same point, counting the\nworkspace written + read once"]
    _legend_right(fig, handles, labels)
    fig.suptitle(f"Roofline with measured ceilings — {results.gpu}\n"
                 f"the roofline of {PALLAS_ARTICLE}; minimum bytes: inputs read once, outputs "
                 "written once (LSE in FP32)",
                 fontsize=11)
    _footer(fig, results)
    return {"roofline": fig}


# ---- (6) device memory vs sequence length ---------------------------------------------------

def _device_memory_bytes(results: Results) -> float | None:
    match = re.search(r"(?im)^.*total.*?memory.*?([\d.]+)\s*(MiB|GiB|MB|GB)\b", results.system)
    if not match:
        return None
    scale = {"MiB": 2 ** 20, "GiB": 2 ** 30, "MB": 1e6, "GB": 1e9}[match.group(2)]
    return float(match.group(1)) * scale


def memory_vs_seqlen(results: Results) -> dict[str, Figure]:
    """Device memory a forward call needs: inputs and outputs plus the reported workspace.
    Skipped rows count too when they report the workspace (that is why some did not run)."""
    per_config: dict[tuple, dict[tuple, dict[int, tuple[int, bool]]]] = {}
    chosen = {b for d in ("fp32", "bf16") for b in chosen_baselines(results, d)}
    for row in results.rows:
        if row.pass_ != "fwd" or row.causal or row.len_q != row.len_kv:
            continue
        if not is_stage(row.stage) and row.impl not in chosen:
            continue
        if row.workspace_bytes is None or not (row.ok or row.status.startswith("skipped")):
            continue
        config = (row.batch, row.heads, row.head_dim)
        per_config.setdefault(config, {}).setdefault(row.impl, {})[row.len_q] = (
            row.workspace_bytes, row.ok)
    configs = [c for c in seqlen_configs(results) if c in per_config]
    if not configs:
        raise NoData("no workspace_bytes in a forward sweep over sequence length")
    device = _device_memory_bytes(results)
    fig = _figure(5.6 * len(configs) + 3.4, 5.9)
    fig.subplots_adjust(left=0.85 / fig.get_figwidth(), right=_legend_edge(fig, 3.2),
                        bottom=0.14, top=0.82, wspace=0.22)
    axes = fig.subplots(1, len(configs), squeeze=False)[0]
    legend = {}
    for ax, config in zip(axes, configs):
        batch, heads, head_dim = config

        def gib(dtype, n, workspace):
            q = batch * heads * n * head_dim
            return (element_bytes(dtype) * 4 * q + 4.0 * batch * heads * n + workspace) / 2 ** 30

        # Every implementation without a workspace needs the same memory as the others of its
        # dtype, so they share a line; the others keep their own curve (or share an identical one).
        groups: dict[tuple, list[tuple]] = {}
        for impl, points in sorted(per_config[config].items(), key=lambda kv: impl_order(kv[0])):
            if all(w == 0 for w, _ in points.values()):
                key = ("none", impl[1])
            else:
                key = ("curve", impl[1], tuple(sorted((n, w) for n, (w, _) in points.items())))
            groups.setdefault(key, []).append(impl)
        lengths = set()
        for key, impls in groups.items():
            dtype = impls[0][1]
            points: dict[int, tuple[int, bool]] = {}
            for impl in impls:
                for n, (w, ok) in per_config[config][impl].items():
                    points[n] = (w, points.get(n, (w, False))[1] or ok)
            xs = sorted(points)
            lengths.update(xs)
            style = impl_style(impls[0])
            names = ", ".join(i[0] for i in impls)
            label = textwrap.fill(f"{names} [{dtype}]", 44)
            label += "\n  no workspace" if key[0] == "none" else "\n  + reported workspace"
            (line,) = ax.plot(xs, [gib(dtype, n, points[n][0]) for n in xs], color=style["color"],
                              linestyle=style["linestyle"], linewidth=style["linewidth"])
            for ran, face in ((True, style["color"]), (False, "white")):
                marks = [(n, gib(dtype, n, points[n][0])) for n in xs if points[n][1] == ran]
                if marks:
                    ax.plot(*zip(*marks), linestyle="none", marker=style["marker"],
                            color=style["color"], markerfacecolor=face)
            legend.setdefault(label, line)
        if device:
            ax.axhline(device / 2 ** 30, color="#c92a2a", linewidth=1.0, linestyle="-.")
            ax.text(min(lengths), device / 2 ** 30 * 1.1,
                    f"device memory {device / 2 ** 30:.0f} GiB (system.txt)",
                    fontsize=7.5, color="#c92a2a")
        ax.set_yscale("log")
        _log2_length_axis(ax, lengths)
        ax.grid(True, which="both", alpha=0.25)
        ax.set_xlabel("sequence length N (Lq = Lkv)")
        ax.set_ylabel("device memory (GiB, log scale)")
        ax.set_title(_shape_text(*config) + ", forward", fontsize=9.5)
    handles = list(legend.values()) + [
        Line2D([], [], linestyle="none", marker="o", markerfacecolor="white", color="#555555")]
    labels = list(legend.keys()) + ["hollow marker: skipped at that N\n(workspace as reported)"]
    _legend_right(fig, handles, labels, labelspacing=0.9)
    fig.suptitle(f"Device memory vs sequence length — {results.gpu}\n"
                 f"the memory comparison of {SERIES_ARTICLE}:\nQ, K, V, O and the FP32 LSE, plus "
                 "the workspace each implementation reports (workspace_bytes column)", fontsize=11)
    _footer(fig, results, flop_note=False)
    return {"memory": fig}


# ---- tables ---------------------------------------------------------------------------------

def ceilings_markdown(results: Results) -> str:
    if not results.ceilings:
        return "_no ceilings.csv in this results folder_"
    lines = ["| ceiling | measured | unit |", "|---|---:|---|"]
    for name, (value, unit) in sorted(results.ceilings.items()):
        lines.append(f"| `{name}` | {value:.4g} | {unit} |")
    return "\n".join(lines)


# ---- driver ---------------------------------------------------------------------------------

FIGURES = [ladder_figure, chapter_speedup_figure, fp32_vs_sdpa_figure, runtime_vs_seqlen,
           speedup_over_naive, forward_backward_vs_seqlen, hopper_ratio_figure, roofline,
           memory_vs_seqlen]


def figure_png(fig: Figure) -> bytes:
    """The PNG bytes of a figure: fixed size and dpi, no metadata, reduced to a 256-colour
    palette (a third of the size, no visible change on line art), so reruns give identical,
    small files."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    try:
        from PIL import Image
    except ImportError:  # matplotlib depends on Pillow, but keep the plain PNG if it is absent
        return buffer.getvalue()
    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(
        colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    small = io.BytesIO()
    image.save(small, format="PNG", optimize=True)
    return small.getvalue()


def draw(function, results: Results) -> dict[str, Figure]:
    """Runs one figure function, printing why instead of failing when its data is absent."""
    try:
        return function(results)
    except NoData as reason:
        print(f"plots: skip {function.__name__}: {reason}")
        return {}


def show(function, results: Results | None) -> None:
    """For the notebook: draw one figure function and display its PNGs inline."""
    if results is None:
        print("no results loaded: nothing to draw")
        return
    from IPython.display import Image, display
    for name, fig in draw(function, results).items():
        print(f"{name}.png")
        display(Image(data=figure_png(fig)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results_dir", nargs="?", help="bench/results/<gpu>/ (default: newest)")
    parser.add_argument("--out", default=str(REPO / "docs" / "img"), help="folder for the PNGs")
    args = parser.parse_args(argv)
    directory = Path(args.results_dir) if args.results_dir else find_results_dir()
    if directory is None:
        print(f"plots: no results folder under {RESULTS_ROOT} (run `make bench` first)",
              file=sys.stderr)
        return 1
    results = load(directory)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"plots: {len(results.rows)} rows from {directory} ({results.gpu}) -> {out}")
    written = 0
    for function in FIGURES:
        for name, fig in draw(function, results).items():
            path = out / f"{name}.png"
            path.write_bytes(figure_png(fig))
            print(f"plots: wrote {path} ({path.stat().st_size // 1024} KiB)")
            written += 1
    if not written:
        print("plots: nothing drawn", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
