#!/usr/bin/env python3
"""Draws the schedule of one block of a Hopper stage as it ran: one row per warpgroup, a bar per
phase, from the stamps bench/experiments/timeline.cu writes (common/timeline.cuh names the
events). Each bar spans two consecutive stamps of a warpgroup, coloured by what lies between:

  tile_ready -> turn                    waiting for its turn to issue (stage 10's ping-pong)
  turn / tile_ready / softmax_done -> issued
                                        issuing wgmma (in 09, for P V also waiting for V)
  issued -> s_done                      waiting for S from the tensor cores
  s_done -> softmax_done                the softmax (09 also rescales O in it)
  softmax_done / issued -> pv_done      waiting for P V
  pv_done / start -> tile_ready         rescaling O, packing P (10), then waiting for K and V
The producer's row marks each tile's loads as issued. Cycles become microseconds through a
straight-line fit of the stamps' %globaltimer nanoseconds against their clock64 cycles.

usage: draw_timeline.py timeline.csv --out figure.png [--block 0] [--tiles 8 13]
"""
import argparse
import csv

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PHASES = [  # (label, colour, the (from, to) event pairs it covers)
    ("waits for its turn", "#d9d9d9", {("tile_ready", "turn")}),
    ("issues wgmma", "#1f4e79", {("turn", "issued"), ("tile_ready", "issued"),
                                 ("softmax_done", "issued")}),
    ("waits for S", "#9ecae1", {("issued", "s_done")}),
    ("softmax", "#c0392b", {("s_done", "softmax_done")}),
    ("waits for P V", "#f4d03f", {("softmax_done", "pv_done"), ("issued", "pv_done")}),
    ("rescales O, waits for K, V", "#a5d6a7", {("pv_done", "tile_ready"), ("start", "tile_ready")}),
]
COLOUR = {pair: (label, colour) for label, colour, pairs in PHASES for pair in pairs}


def read(path, block):
    rows = [r for r in csv.DictReader(line for line in open(path) if not line.startswith("#"))
            if int(r["block"]) == block]
    if not rows:
        raise SystemExit(f"draw_timeline: no stamps of block {block} in {path}")
    cycles = [int(r["cycle"]) for r in rows]
    nanoseconds = [int(r["nanoseconds"]) for r in rows]
    n = len(rows)
    mean_c, mean_n = sum(cycles) / n, sum(nanoseconds) / n
    spread = sum((c - mean_c) ** 2 for c in cycles)
    slope = (sum((c - mean_c) * (t - mean_n) for c, t in zip(cycles, nanoseconds)) / spread
             if spread else 1 / 1.755)
    start = min(cycles)
    for r in rows:
        r["us"] = (int(r["cycle"]) - start) * slope / 1e3
    return rows, 1 / slope  # cycles per nanosecond: the SM clock in GHz


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--out", required=True)
    parser.add_argument("--block", type=int, default=0)
    parser.add_argument("--tiles", type=int, nargs=2, default=(8, 13),
                        help="the tiles of the zoomed panel (first, last)")
    arguments = parser.parse_args()
    rows, ghz = read(arguments.csv, arguments.block)
    warpgroups = sorted({int(r["warpgroup"]) for r in rows})
    title = open(arguments.csv).readline().lstrip("# ").strip()

    fig, axes = plt.subplots(2, 1, figsize=(11, 5.8), dpi=130,
                             gridspec_kw={"height_ratios": [1, 1.3]})
    first, last = arguments.tiles
    zoom_range = None
    for ax, zoom in zip(axes, (False, True)):
        for y, warpgroup in enumerate(warpgroups):
            stamps = [r for r in rows if int(r["warpgroup"]) == warpgroup]
            if warpgroup < 0:
                loads = [r["us"] for r in stamps if r["event"] == "loaded"]
                ax.plot(loads, [y] * len(loads), "|", color="#2e7d32", ms=12, mew=1.5)
                continue
            stamps.sort(key=lambda r: r["us"])
            for before, after in zip(stamps, stamps[1:]):
                phase = COLOUR.get((before["event"], after["event"]))
                if phase is None or (zoom and not first <= int(before["tile"]) <= last):
                    continue
                ax.barh(y, after["us"] - before["us"], left=before["us"], height=0.6,
                        color=phase[1], edgecolor="none")
                if zoom and before["event"] == "tile_ready":
                    ax.text(before["us"], y + 0.38, f"j={before['tile']}", fontsize=6,
                            color="#333")
        ax.set_yticks(range(len(warpgroups)))
        ax.set_yticklabels(["producer" if w < 0 else f"consumer {w}" for w in warpgroups])
        ax.invert_yaxis()
        ax.set_xlabel("microseconds since the block's first stamp")
        if zoom:
            times = [r["us"] for r in rows if first <= int(r["tile"]) <= last
                     and int(r["warpgroup"]) >= 0]
            if times:
                zoom_range = (min(times), max(times))
                ax.set_xlim(*zoom_range)
            ax.set_title(f"tiles {first} to {last}", fontsize=9)
        else:
            ax.set_title(f"{title}; block {arguments.block}, SM clock {ghz:.2f} GHz from the "
                         "stamps", fontsize=9)
    if zoom_range:
        axes[0].axvspan(*zoom_range, color="#000000", alpha=0.06)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour) for _, colour, _ in PHASES]
    handles.append(plt.Line2D([], [], marker="|", ls="", color="#2e7d32", ms=10, mew=1.5))
    fig.legend(handles, [label for label, _, _ in PHASES] + ["producer: a tile's loads issued"],
               loc="lower center", ncol=4, frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    fig.savefig(arguments.out)
    print(f"draw_timeline: wrote {arguments.out}")


if __name__ == "__main__":
    main()
