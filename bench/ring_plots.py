#!/usr/bin/env python3
"""The ring's scaling figure from the CSVs of 13_ring_attention's benchmark (bench_ring.cpp's
columns; PyTorch's context parallelism, bench/torch_context_parallel.py, writes the same).

    python3 bench/ring_plots.py CSV [CSV ...] --out FILE.png [--title TEXT]

Per pass (forward, backward), the per-GPU TFLOP/s of each run as a fraction of the ring's own
kernel's alone on the same machine (the CSV's `efficiency`; rows without a baseline, PyTorch's,
are drawn against the baseline rate of the same GPU count, length and mask where the files have
one), against tokens per GPU; one line per GPU count, sharding and mask. The 90% line is the
course's target. Only rows whose status is `ok` are drawn; the figure names the GPU and the
files it was drawn from, so that rows of different runs are never taken for one run.
"""

import argparse
import sys
import textwrap

from ring_table import TARGET, TORCH, collapse_rounds, efficiency, read_rows

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402


def name(sharding):
    """A series' name: the ring's sharding, or PyTorch's context parallelism by its rotation."""
    return f"PyTorch CP ({sharding[len(TORCH):]})" if sharding.startswith(TORCH) else sharding


def figure(rows, title):
    fig = Figure(figsize=(11, 4.6), constrained_layout=True)
    axes = fig.subplots(1, 2, sharey=True)
    series = sorted({(int(r["gpus"]), r["sharding"], int(r["causal"])) for r in rows})
    markers = {2: "o", 4: "s", 8: "D"}
    for ax, pass_name, label in zip(axes, ("fwd", "bwd"), ("forward", "backward")):
        for gpus, sharding, causal in series:
            points = sorted((int(r["len"]) // gpus, efficiency(r, rows)) for r in rows
                            if (int(r["gpus"]), r["sharding"], int(r["causal"])) == (gpus, sharding, causal)
                            and r["pass"] == pass_name)
            points = [(x, y) for x, y in points if y is not None]
            if not points:
                continue
            ax.plot([x for x, _ in points], [y for _, y in points], marker=markers.get(gpus, "^"),
                    linestyle="-" if causal else "--",
                    label=f"{gpus} GPUs, {name(sharding)}, {'causal' if causal else 'non-causal'}")
        ax.axhline(TARGET, color="grey", linewidth=1, linestyle=":")
        ax.text(ax.get_xlim()[0] if ax.lines else 1, TARGET, " 90%: the target", va="bottom",
                fontsize=8, color="grey")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1024:g}K"))
        ax.set_xlabel("tokens per GPU")
        ax.set_title(label)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("per-GPU TFLOP/s / the kernel alone")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right center", fontsize=8)
    gpus = sorted({r["gpu"] for r in rows})
    files = sorted({r["file"] for r in rows})
    # Wrapped at the figure's width: a long GPU name would otherwise run off both edges.
    fig.suptitle(textwrap.fill(f"{title}: {', '.join(gpus)}; rows from {', '.join(files)}", 120),
                 fontsize=10)
    return fig


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--title", default="Ring attention, per GPU against its kernel alone")
    arguments = parser.parse_args()
    rows = collapse_rounds(read_rows(arguments.csv))
    if not rows:
        print("ring_plots: no row with status ok", file=sys.stderr)
        return 1
    figure(rows, arguments.title).savefig(arguments.out, dpi=120)
    print(f"ring_plots: wrote {arguments.out} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
