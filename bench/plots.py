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
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RESULTS_ROOT = REPO / "bench" / "results"
ENV_RESULTS = "BENCH_RESULTS_DIR"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from schema import CSV_COLUMNS as COLUMNS, STAGES, read_sweeps  # noqa: E402

FLOP_NOTE = ("FLOPs: FlashAttention convention, forward 4·B·H·Lq·Lkv·d (halved when causal), "
             "backward 2.5× forward; times are medians of repeats.")

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
LATENCY_LENGTH = 4096

BASELINES = ["cublas_fp32", "cublas_bf16", "torch_flash", "torch_cudnn", "torch_efficient",
             "torch_math", "torch_eager"]
NAIVE = "00_naive"
BACKWARD_STAGE = "07_backward"
BF16_FORWARD_STAGES = ["05_mma_swizzle", "06_pipelined", "07_backward"]

DPI = 120
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
    pass_: str          # "fwd" or "bwd"
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
    return forward * (2.5 if row.pass_ == "bwd" else 1.0)


def element_bytes(dtype: str) -> int:
    return ELEMENT_BYTES.get(dtype, 4)


def min_bytes(row: Row) -> float:
    """Each input read once, each output written once (common/harness.cpp)."""
    q = row.batch * row.heads * row.len_q * row.head_dim
    kv = row.batch * row.heads * row.len_kv * row.head_dim
    lse = row.batch * row.heads * row.len_q
    factor = 4 if row.pass_ == "bwd" else 2
    return element_bytes(row.dtype) * (factor * q + factor * kv) + 4.0 * lse


def tflops_of(row: Row) -> float:
    return row.tflops if row.tflops else flops(row) / (row.median_ms * 1e-3) / 1e12


def ceiling_name(dtype: str) -> str:
    return "bf16_gemm" if dtype in ("bf16", "fp16") else "fp32_gemm"


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


def impl_label(impl: tuple[str, str]) -> str:
    stage, dtype = impl
    if is_stage(stage) or stage.endswith(dtype):
        return f"{stage} ({dtype})" if not stage.endswith(dtype) else stage
    return f"{stage} ({dtype})"


_STAGE_COLORS = ["#440154", "#3b528b", "#21908d", "#5dc863", "#b5a000",
                 "#e8590c", "#d6336c", "#862e9c"]
_BASELINE_STYLE = {  # color, marker
    "cublas_fp32": ("#8d6e63", "s"), "cublas_bf16": ("#8d6e63", "p"),
    "torch_flash": ("#000000", "x"), "torch_cudnn": ("#c92a2a", "+"),
    "torch_efficient": ("#1864ab", "1"), "torch_math": ("#868e96", "2"),
    "torch_eager": ("#5c940d", "3"),
}
_STAGE_MARKERS = "osD^vP*X"


def impl_style(impl: tuple[str, str]) -> dict:
    stage, dtype = impl
    if is_stage(stage):
        index = STAGES.index(stage) if stage in STAGES else int(stage[:2])
        return dict(color=_STAGE_COLORS[index % len(_STAGE_COLORS)], linestyle="-",
                    marker=_STAGE_MARKERS[index % len(_STAGE_MARKERS)], linewidth=1.8,
                    markersize=5)
    color, marker = _BASELINE_STYLE.get(stage, ("#adb5bd", "."))
    return dict(color=color, marker=marker, linewidth=1.1, markersize=6,
                linestyle="--" if dtype in ("bf16", "fp16") else ":")


# ---- shared figure pieces -------------------------------------------------------------------

def _figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), dpi=DPI)


def _footer(fig: Figure, results: Results, flop_note: bool = True) -> None:
    parts = [FLOP_NOTE] if flop_note else ["Times are medians of repeats."]
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


# ---- (1) runtime vs sequence length ---------------------------------------------------------

def runtime_vs_seqlen(results: Results) -> dict[str, Figure]:
    """Forward time of every stage and baseline against N, log-log; non-causal and causal side
    by side, one figure per (B, H, d) of the seqlen sweep."""
    configs = seqlen_configs(results)
    if not configs:
        raise NoData("no forward sweep over sequence length (need 3+ lengths of one B, H, d)")
    figures = {}
    for config in configs:
        panels = _causal_panels(results, config)
        fig = _figure(6.0 * len(panels) + 2.6, 5.4)
        fig.subplots_adjust(left=0.85 / fig.get_figwidth(), right=_legend_edge(fig, 2.5),
                            bottom=0.14, top=0.88, wspace=0.18)
        legend = {}
        axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
        for ax, (causal, series) in zip(axes, panels):
            lengths = set()
            for impl, rows in series.items():
                xs = [r.len_q for r in rows]
                lengths.update(xs)
                (line,) = ax.plot(xs, [r.median_ms for r in rows], label=impl_label(impl),
                                  **impl_style(impl))
                legend.setdefault(impl, line)
            ax.set_yscale("log")
            _log2_length_axis(ax, lengths)
            ax.set_xlabel("sequence length N (Lq = Lkv)")
            ax.set_title("causal" if causal else "non-causal", fontsize=10)
            ax.grid(True, which="both", alpha=0.25)
        axes[0].set_ylabel("forward time (ms, log scale)")
        fig.suptitle(f"Forward runtime vs sequence length — {results.gpu}\n"
                     f"{_shape_text(*config)}", fontsize=11)
        ordered = sorted(legend, key=impl_order)
        _legend_right(fig, [legend[i] for i in ordered], [impl_label(i) for i in ordered])
        _footer(fig, results, flop_note=False)
        figures[f"runtime_{_config_slug(*config)}"] = fig
    return figures


# ---- (2) speedup over the naive stage -------------------------------------------------------

def speedup_over_naive(results: Results) -> dict[str, Figure]:
    """Naive forward time divided by each implementation's, at every N where both ran."""
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
        fig = _figure(6.0 * len(panels) + 2.6, 5.4)
        fig.subplots_adjust(left=0.85 / fig.get_figwidth(), right=_legend_edge(fig, 2.5),
                            bottom=0.14, top=0.88, wspace=0.18)
        axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
        legend = {}
        for ax, (causal, series, naive) in zip(axes, panels):
            for impl, rows in series.items():
                points = [(r.len_q, naive[r.len_q] / r.median_ms) for r in rows if r.len_q in naive]
                if not points or impl == (NAIVE, "fp32"):
                    continue
                (line,) = ax.plot(*zip(*points), label=impl_label(impl), **impl_style(impl))
                legend.setdefault(impl, line)
            ax.axhline(1.0, color="#444444", linewidth=0.9)
            ax.set_yscale("log")
            _log2_length_axis(ax, naive)
            ax.set_xlabel(f"sequence length N (Lq = Lkv); only N where {NAIVE} ran")
            ax.set_title("causal" if causal else "non-causal", fontsize=10)
            ax.grid(True, which="both", alpha=0.25)
        axes[0].set_ylabel(f"speedup over {NAIVE} (× , log scale)")
        fig.suptitle(f"Forward speedup over {NAIVE} (FP32) — {results.gpu}\n"
                     f"{_shape_text(*config)}; ratio of median times, same run", fontsize=11)
        ordered = sorted(legend, key=impl_order)
        _legend_right(fig, [legend[i] for i in ordered], [impl_label(i) for i in ordered])
        _footer(fig, results, flop_note=False)
        figures[f"speedup_{_config_slug(*config)}"] = fig
    return figures


# ---- (3) TFLOP/s and % of the measured ceiling at the headline shapes -----------------------

def _headline_rows(results: Results, shape, pass_: str) -> list[Row]:
    batch, heads, len_q, len_kv, head_dim = shape
    rows = results.ok_rows(batch=batch, heads=heads, len_q=len_q, len_kv=len_kv,
                           head_dim=head_dim, causal=False, pass_=pass_)
    return sorted(rows, key=lambda r: impl_order(r.impl))


def tflops_at_headlines(results: Results) -> dict[str, Figure]:
    """Bars per stage: TFLOP/s and % of the measured GEMM ceiling of its element type;
    baselines as vertical reference lines. One figure per headline shape, a row per pass."""
    figures = {}
    for name, shape in HEADLINES.items():
        passes = [(p, _headline_rows(results, shape, p)) for p in ("fwd", "bwd")]
        passes = [(p, rows) for p, rows in passes if any(is_stage(r.stage) for r in rows)]
        if not passes:
            print(f"plots: skip tflops_{name}: no stage measured at {shape} non-causal")
            continue
        counts = [sum(is_stage(r.stage) for r in rows) for _, rows in passes]
        height = 1.6 + sum(1.0 + 0.36 * n for n in counts)
        fig = _figure(13.0, height)
        fig.subplots_adjust(left=0.16, right=_legend_edge(fig, 2.6), bottom=0.75 / height + 0.03,
                            top=1 - 0.85 / height, wspace=0.08, hspace=1.1 / (height / len(passes)))
        grid = fig.subplots(len(passes), 2, squeeze=False,
                            gridspec_kw={"height_ratios": [0.6 + n for n in counts]})
        legend = {}
        for (pass_, rows), (ax_tflops, ax_pct) in zip(passes, grid):
            stages = [r for r in rows if is_stage(r.stage)]
            baselines = [r for r in rows if not is_stage(r.stage)]
            ys = list(range(len(stages)))[::-1]
            values = [tflops_of(r) for r in stages]
            percents = [pct_of_ceiling(r, results) for r in stages]
            colors = [impl_style(r.impl)["color"] for r in stages]
            ax_pct.barh(ys, [p or 0 for p in percents], color=colors, height=0.65)
            for y, v, p in zip(ys, values, percents):
                ax_tflops.text(v, y, f" {v:.3g}", va="center", fontsize=8)
                ax_pct.text(p or 0, y, f" {p:.3g}%" if p is not None else " no ceiling",
                            va="center", fontsize=8)
            ax_tflops.set_yticks(ys, [f"{r.stage} ({r.dtype})" for r in stages], fontsize=8)
            ax_pct.set_yticks(ys, [""] * len(ys))
            for row in baselines:
                style = impl_style(row.impl)
                line = ax_tflops.axvline(tflops_of(row), color=style["color"],
                                         linestyle=style["linestyle"], linewidth=1.2)
                pct = pct_of_ceiling(row, results)
                if pct is not None:
                    ax_pct.axvline(pct, color=style["color"], linestyle=style["linestyle"],
                                   linewidth=1.2)
                legend.setdefault(row.impl, line)
            every = values + [tflops_of(r) for r in baselines]
            if max(every) / min(every) > 30:  # FP32 and BF16 side by side: a log axis shows both
                ax_tflops.set_xscale("log")
                ax_tflops.set_xlim(min(every) / 2, max(every) * 2.5)
                ax_tflops.barh(ys, [v - min(every) / 2 for v in values], color=colors,
                               height=0.65, left=min(every) / 2)
            else:
                ax_tflops.set_xlim(0, max(every) * 1.15)
                ax_tflops.barh(ys, values, color=colors, height=0.65)
            pct_span = max([p or 0 for p in percents] +
                           [pct_of_ceiling(r, results) or 0 for r in baselines] + [1])
            ax_pct.set_xlim(0, pct_span * 1.15)
            label = "forward" if pass_ == "fwd" else "backward"
            log = ax_tflops.get_xscale() == "log"
            ax_tflops.set_xlabel(f"{label} TFLOP/s" + (" (log scale)" if log else ""))
            ax_pct.set_xlabel(f"{label}: % of the measured GEMM ceiling of its dtype")
            for ax in (ax_tflops, ax_pct):
                ax.grid(True, axis="x", alpha=0.25)
                ax.set_ylim(-0.6, len(stages) - 0.4)
            ax_tflops.set_title(label, fontsize=10, loc="left")
        ceilings = [f"{n} {results.ceiling(n):.4g} TFLOP/s" for n in ("fp32_gemm", "bf16_gemm")
                    if results.ceiling(n)]
        batch, heads, len_q, len_kv, head_dim = shape
        fig.suptitle(f"Throughput at the {name.replace('_', ' ')} shape — {results.gpu}\n"
                     f"B={batch}, H={heads}, Lq={len_q}, Lkv={len_kv}, d={head_dim}, "
                     f"non-causal; ceilings: {', '.join(ceilings) or 'not measured'}",
                     fontsize=11)
        ordered = sorted(legend, key=impl_order)
        if ordered:
            _legend_right(fig, [legend[i] for i in ordered], [impl_label(i) for i in ordered],
                          title="baselines", title_fontsize=8)
        _footer(fig, results)
        figures[f"tflops_{name}"] = fig
    if not figures:
        raise NoData("no stage measured at a headline shape")
    return figures


# ---- (4) forward and backward time: naive, the course's best, cuDNN -------------------------

def _best_forward_stage(series: dict[tuple, list[Row]]) -> tuple | None:
    """The BF16 stage with the lowest geometric-mean time over the lengths all candidates ran."""
    candidates = [(s, "bf16") for s in BF16_FORWARD_STAGES if series.get((s, "bf16"))]
    if not candidates:
        return None
    common = set.intersection(*({r.len_q for r in series[c]} for c in candidates))
    if not common:
        return max(candidates, key=lambda c: len(series[c]))

    def score(impl):
        times = [r.median_ms for r in series[impl] if r.len_q in common]
        return sum(math.log(t) for t in times) / len(times)
    return min(candidates, key=score)


def _naive_choice(series: dict[tuple, list[Row]]) -> tuple | None:
    for impl in (("torch_eager", "bf16"), (NAIVE, "fp32"), ("torch_eager", "fp32")):
        if series.get(impl):
            return impl
    return None


def forward_backward_vs_seqlen(results: Results) -> dict[str, Figure]:
    """Forward and backward time against N for the naive implementation (PyTorch eager, else
    stage 00), the course's best stage and cuDNN; rows non-causal and causal."""
    figures = {}
    configs = sorted(set(seqlen_configs(results, "fwd")) | set(seqlen_configs(results, "bwd")),
                     key=_config_order)
    for config in configs:
        cells = []
        for causal in (False, True):
            forward = _series(results, config, causal, "fwd")
            backward = _series(results, config, causal, "bwd")
            cudnn = ("torch_cudnn", "bf16")
            backward_best = (BACKWARD_STAGE, "bf16")
            picks = {
                "fwd": [("naive", _naive_choice(forward)),
                        ("course best", _best_forward_stage(forward)),
                        ("cuDNN", cudnn if forward.get(cudnn) else None)],
                "bwd": [("naive", _naive_choice(backward)),
                        ("course best", backward_best if backward.get(backward_best) else None),
                        ("cuDNN", cudnn if backward.get(cudnn) else None)],
            }
            for pass_, series in (("fwd", forward), ("bwd", backward)):
                chosen = [(role, impl) for role, impl in picks[pass_] if impl]
                # A panel is about the course's best: without it, naive against cuDNN says nothing.
                if any(role == "course best" for role, _ in chosen):
                    cells.append((causal, pass_,
                                  [(role, impl, series[impl]) for role, impl in chosen]))
        if not cells:
            print(f"plots: skip fwd_bwd_{_config_slug(*config)}: no BF16 stage in this sweep")
            continue
        causals = sorted({c for c, _, _ in cells})
        passes = [p for p in ("fwd", "bwd") if any(p == q for _, q, _ in cells)]
        fig = _figure(5.2 * len(passes) + 2.8, 1.3 + 3.6 * len(causals))
        one_row = len(causals) == 1
        fig.subplots_adjust(left=0.85 / fig.get_figwidth(), right=_legend_edge(fig, 2.8),
                            bottom=0.13 if one_row else 0.08, top=0.86 if one_row else 0.9,
                            wspace=0.22, hspace=0.38)
        grid = fig.subplots(len(causals), len(passes), squeeze=False)
        legend = {}
        for causal, pass_, lines in cells:
            ax = grid[causals.index(causal)][passes.index(pass_)]
            lengths = set()
            for role, impl, rows in lines:
                xs = [r.len_q for r in rows]
                lengths.update(xs)
                label = f"{role}: {impl_label(impl)}"
                (line,) = ax.plot(xs, [r.median_ms for r in rows], label=label, **impl_style(impl))
                legend.setdefault(label, line)
            ax.set_yscale("log")
            _log2_length_axis(ax, lengths)
            ax.grid(True, which="both", alpha=0.25)
            ax.set_title(f"{'forward' if pass_ == 'fwd' else 'backward'}, "
                         f"{'causal' if causal else 'non-causal'}", fontsize=10)
            ax.set_xlabel("sequence length N (Lq = Lkv)")
            ax.set_ylabel("time (ms, log scale)")
        for row in grid:
            for ax in row:
                if not ax.has_data():
                    ax.set_axis_off()
        fig.suptitle(f"Forward and backward time vs sequence length — {results.gpu}\n"
                     f"{_shape_text(*config)}", fontsize=11)
        _legend_right(fig, list(legend.values()), list(legend.keys()))
        _footer(fig, results, flop_note=False)
        figures[f"fwd_bwd_{_config_slug(*config)}"] = fig
    if not figures:
        raise NoData("no sweep over sequence length with a BF16 stage")
    return figures


# ---- (5) roofline ---------------------------------------------------------------------------

def _roofline_rows(results: Results, pass_: str) -> list[Row]:
    """The non-causal shape with the most implementations measured, the BF16 headline first."""
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
    return sorted(rows, key=lambda r: impl_order(r.impl))


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
        ax.text(low * 1.3, low * 1.3 * bandwidth_tb * 1.35, f"copy: {copy:.4g} GB/s",
                rotation=0, fontsize=7.5, ha="left", va="bottom")
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
    labels = list(legend.keys()) + ["roof: min(GEMM ceiling,\nAI × copy bandwidth)",
                                    "same point, counting the\nworkspace written + read once"]
    _legend_right(fig, handles, labels)
    fig.suptitle(f"Roofline with measured ceilings — {results.gpu}\n"
                 "minimum bytes: inputs read once, outputs written once (LSE in FP32)",
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
    for row in results.rows:
        if row.pass_ != "fwd" or row.causal or row.len_q != row.len_kv:
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
    fig = _figure(5.6 * len(configs) + 3.4, 5.6)
    fig.subplots_adjust(left=0.85 / fig.get_figwidth(), right=_legend_edge(fig, 3.2),
                        bottom=0.14, top=0.86, wspace=0.22)
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
                 "Q, K, V, O and the FP32 LSE, plus the workspace each implementation reports "
                 "(workspace_bytes column)", fontsize=11)
    _footer(fig, results, flop_note=False)
    return {"memory": fig}


# ---- (7) latency at one length --------------------------------------------------------------

def latency_bars(results: Results, length: int = LATENCY_LENGTH) -> dict[str, Figure]:
    """Forward time at N = `length` per implementation, a panel per (B, H, d) configuration."""
    panels = []
    for config in seqlen_configs(results):
        batch, heads, head_dim = config
        rows = results.ok_rows(batch=batch, heads=heads, head_dim=head_dim, len_q=length,
                               len_kv=length, causal=False, pass_="fwd")
        if rows:
            panels.append((config, sorted(rows, key=lambda r: impl_order(r.impl))))
    if not panels:
        raise NoData(f"no non-causal forward row at N={length} in a sequence-length sweep")
    count = max(len(rows) for _, rows in panels)
    height = 1.5 + 0.3 * count
    fig = _figure(6.0 * len(panels) + 1.2, height)
    fig.subplots_adjust(left=0.16 if len(panels) > 1 else 0.25, right=0.97,
                        bottom=0.8 / height + 0.05, top=1 - 0.75 / height, wspace=0.5)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (config, rows) in zip(axes, panels):
        ys = list(range(len(rows)))[::-1]
        times = [r.median_ms for r in rows]
        colors = [impl_style(r.impl)["color"] for r in rows]
        hatches = [None if is_stage(r.stage) else "//" for r in rows]
        bars = ax.barh(ys, times, color=colors, height=0.7)
        for bar, hatch, row in zip(bars, hatches, rows):
            if hatch:
                bar.set_hatch(hatch)
                bar.set_alpha(0.75)
        for y, t in zip(ys, times):
            ax.text(t, y, f" {t:.3g}", va="center", fontsize=7.5)
        ax.set_yticks(ys, [impl_label(r.impl) for r in rows], fontsize=8)
        ax.set_xscale("log")
        ax.set_xlim(min(times) / 1.5, max(times) * 4)
        ax.grid(True, axis="x", which="both", alpha=0.25)
        ax.set_xlabel("forward time (ms, log scale)")
        ax.set_title(_shape_text(*config, len_text=f"N={length}") + ", non-causal", fontsize=9.5)
    fig.suptitle(f"Forward latency at N={length} — {results.gpu}\n"
                 "stages solid, baselines hatched", fontsize=11)
    _footer(fig, results, flop_note=False)
    return {f"latency_n{length}": fig}


# ---- tables ---------------------------------------------------------------------------------

def ceilings_markdown(results: Results) -> str:
    if not results.ceilings:
        return "_no ceilings.csv in this results folder_"
    lines = ["| ceiling | measured | unit |", "|---|---:|---|"]
    for name, (value, unit) in sorted(results.ceilings.items()):
        lines.append(f"| `{name}` | {value:.4g} | {unit} |")
    return "\n".join(lines)


# ---- driver ---------------------------------------------------------------------------------

FIGURES = [runtime_vs_seqlen, speedup_over_naive, tflops_at_headlines,
           forward_backward_vs_seqlen, roofline, memory_vs_seqlen, latency_bars]


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
