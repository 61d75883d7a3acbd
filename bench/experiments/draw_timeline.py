#!/usr/bin/env python3
"""Draws the schedule of one block of a Hopper stage as it ran: one row per warpgroup, a bar per
phase, from the stamps bench/experiments/timeline.cu writes (common/timeline.cuh names the
events); with --summary, prints the phases' durations instead, per stage, over the steady tiles.
Each bar spans two consecutive stamps of a warpgroup, coloured by what lies between:

  tile_ready -> turn                    waiting for its turn to issue (stage 10's ping-pong)
  turn / tile_ready -> issued           issuing wgmma: S (and, in 10, P V of the previous tile)
  softmax_done -> issued                issuing P V (in 09 after waiting for V)
  issued -> s_done                      waiting for S from the tensor cores
  s_done -> softmax_done                the softmax (08 and 09 also rescale O in it)
  softmax_done / issued -> pv_done      waiting for P V
  pv_done / start -> tile_ready         what lies between P V and the next tile: 08's
                                        __syncthreads, 09's release of V, 10's rescale of O
                                        and packing of P; then waiting for K (and V)
A tile's phases run from its tile_ready stamp to the next one (stage 10 stamps pv_done with the
previous tile's number; it still belongs to the tile in whose loop it is). One thread, lane 0 of
the warpgroup's first warp, stamps for the warpgroup. The producer's row marks each tile's loads
as issued. Cycles become microseconds through a straight-line fit of the stamps' %globaltimer
nanoseconds against their clock64 cycles, per block (each block has its own SM's clock).

The summary takes the steady tiles (all but the first two and the last two) of every block and
prints per phase its median duration and its share of the tile, the tile period, how much of a
warpgroup's softmax runs beside the other's GEMM phases and beside its softmax, and per block its
length, its ends and the GEMM work of its steady tiles.

usage: draw_timeline.py timeline.csv --out figure.png [--block 0] [--tiles 21 24]
       draw_timeline.py timeline.csv [more.csv ...] --summary
"""
import argparse
import csv
import os
import re
import statistics

PHASES = [  # (key, label, colour, the (from, to) event pairs it covers)
    ("turn", "waits for its turn", "#d9d9d9", {("tile_ready", "turn")}),
    ("issue", "issues S", "#1f4e79", {("turn", "issued"), ("tile_ready", "issued")}),
    ("wait_s", "waits for S", "#9ecae1", {("issued", "s_done")}),
    ("softmax", "softmax", "#c0392b", {("s_done", "softmax_done")}),
    ("issue_pv", "issues P V", "#6a9fd4", {("softmax_done", "issued")}),
    ("wait_pv", "waits for P V", "#f4d03f", {("softmax_done", "pv_done"), ("issued", "pv_done")}),
    ("after", "after P V until K, V are ready", "#a5d6a7", {("pv_done", "tile_ready"),
                                                             ("start", "tile_ready")}),
]
PHASE = {pair: key for key, _, _, pairs in PHASES for pair in pairs}
COLOUR = {key: colour for key, _, colour, _ in PHASES}
GEMM_PHASES = {"issue", "wait_s", "issue_pv", "wait_pv"}  # the warpgroup's GEMMs are queued or run
# What a phase holds differs between the stages; the legend and the table say it for the stage.
STAGE_LABELS = {
    "08": {"softmax": "softmax, rescales O", "after": "__syncthreads, waits for K, V"},
    "09": {"softmax": "softmax, rescales O", "issue_pv": "waits for V, issues P V",
           "after": "releases V, waits for K"},
    "10": {"issue": "issues S and the previous tile's P V",
           "after": "rescales O, packs P, waits for K, V"},
}


def read(path):
    """The stamps of every block, each with its time in microseconds since its block's first
    stamp, and per block the SM clock the fit gives (GHz). The CSV's first line names the shape."""
    with open(path) as file:
        title = file.readline().lstrip("# ").strip()
        rows = list(csv.DictReader(line for line in file if not line.startswith("#")))
    blocks, clocks = {}, {}
    for r in rows:
        r["warpgroup"], r["tile"], r["cycle"] = int(r["warpgroup"]), int(r["tile"]), int(r["cycle"])
        blocks.setdefault(int(r["block"]), []).append(r)
    for block, stamps in blocks.items():
        cycles = [r["cycle"] for r in stamps]
        nanoseconds = [int(r["nanoseconds"]) for r in stamps]
        n = len(stamps)
        mean_c, mean_n = sum(cycles) / n, sum(nanoseconds) / n
        spread = sum((c - mean_c) ** 2 for c in cycles)
        slope = (sum((c - mean_c) * (t - mean_n) for c, t in zip(cycles, nanoseconds)) / spread
                 if spread else 1 / 1.755)
        start = min(cycles)
        for r in stamps:
            r["us"] = (r["cycle"] - start) * slope / 1e3
        clocks[block] = 1 / slope
    return title, blocks, clocks


def phases(stamps):
    """A consumer's stamps as phases: (key, start us, end us, tile), the tile being the one whose
    tile_ready stamp last came before the phase (0 before the first)."""
    stamps = sorted(stamps, key=lambda r: r["cycle"])
    found, tile = [], 0
    for before, after in zip(stamps, stamps[1:]):
        if before["event"] == "tile_ready":
            tile = before["tile"]
        key = PHASE.get((before["event"], after["event"]))
        if key:
            found.append((key, before["us"], after["us"], tile))
    return found


def tile_count(stamps):
    return max(r["tile"] for r in stamps if r["event"] == "end")


def steady(tile, tiles):
    """The steady state: leave out the first two tiles (the ring filling) and the last two."""
    return 2 <= tile <= tiles - 3


def overlap(intervals, others):
    """How much of the intervals lies inside the union of the others (lists of (start, end))."""
    union = []
    for start, end in sorted(others):
        if union and start <= union[-1][1]:
            union[-1][1] = max(union[-1][1], end)
        else:
            union.append([start, end])
    return sum(max(0.0, min(end, other_end) - max(start, other_start))
               for start, end in intervals for other_start, other_end in union)


def draw(arguments):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title, blocks, clocks = read(arguments.csv)
    if arguments.block not in blocks:
        raise SystemExit(f"draw_timeline: no stamps of block {arguments.block} in "
                         f"{arguments.csv}")
    rows = blocks[arguments.block]
    stage = title[:2]
    labels = {key: STAGE_LABELS.get(stage, {}).get(key, label) for key, label, _, _ in PHASES}
    warpgroups = sorted({r["warpgroup"] for r in rows})
    has_producer = warpgroups[0] < 0
    consumer = "consumer" if has_producer else "warpgroup"
    tiles = tile_count([r for r in rows if r["warpgroup"] >= 0])
    first, last = arguments.tiles if arguments.tiles else (tiles // 2 - 2, tiles // 2 + 1)

    found = {w: phases([r for r in rows if r["warpgroup"] == w]) for w in warpgroups if w >= 0}
    zoomed = [(start, end) for w in found for key, start, end, tile in found[w]
              if first <= tile <= last]
    if not zoomed:
        raise SystemExit(f"draw_timeline: block {arguments.block} has no tiles {first} to {last}")
    zoom_range = (min(start for start, _ in zoomed), max(end for _, end in zoomed))

    fig, axes = plt.subplots(2, 1, figsize=(11, 6.2), dpi=130,
                             gridspec_kw={"height_ratios": [1, 1.4]})
    seen = set()
    for ax, zoom in zip(axes, (False, True)):
        for y, warpgroup in enumerate(warpgroups):
            if warpgroup < 0:
                loads = [r for r in rows if r["warpgroup"] == warpgroup and r["event"] == "loaded"
                         and (not zoom or zoom_range[0] <= r["us"] <= zoom_range[1])]
                ax.plot([r["us"] for r in loads], [y] * len(loads), "|", color="#2e7d32", ms=12,
                        mew=1.5)
                for r in loads if zoom else []:
                    ax.text(r["us"], y - 0.32, f"{r['tile']}", fontsize=6.5, ha="center",
                            color="#2e7d32")
                continue
            for key, start, end, tile in found[warpgroup]:
                if zoom and not first <= tile <= last:
                    continue
                seen.add(key)
                ax.barh(y, end - start, left=start, height=0.6, color=COLOUR[key],
                        edgecolor="white" if zoom else "none", linewidth=0.4)
            for r in rows if zoom else []:
                if (r["warpgroup"] == warpgroup and r["event"] == "tile_ready"
                        and first <= r["tile"] <= last):
                    ax.text(r["us"], y - 0.34, f"tile {r['tile']}", fontsize=6.5, color="#333")
        ax.set_yticks(range(len(warpgroups)))
        ax.set_yticklabels(["producer" if w < 0 else f"{consumer} {w}" for w in warpgroups])
        ax.set_ylim(len(warpgroups) - 0.5, -0.6)
        ax.set_xlabel("microseconds since the block's first stamp")
        if zoom:
            ax.set_xlim(*zoom_range)
            ax.set_title(f"tiles {first} to {last} of {tiles}, in the steady state: a tile runs "
                         "from its K, V ready to the next tile's" +
                         ("; above the producer's marks, the tile loaded" if has_producer else ""),
                         fontsize=8.5)
        else:
            ax.set_xlim(left=0)
            ax.set_title(f"{title}\nblock {arguments.block}, all {tiles} K/V tiles; SM clock "
                         f"{clocks[arguments.block]:.2f} GHz from the stamps (the phase stamps "
                         "cost time themselves)", fontsize=9)
    axes[0].axvspan(*zoom_range, color="#000000", alpha=0.08, zorder=0)
    keys = [key for key, _, _, _ in PHASES if key in seen]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOUR[key]) for key in keys]
    names = [labels[key] for key in keys]
    if has_producer:
        handles.append(plt.Line2D([], [], marker="|", ls="", color="#2e7d32", ms=10, mew=1.5))
        names.append("producer: a tile's K and V loads issued")
    fig.legend(handles, names, loc="lower center", ncol=3, frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(arguments.out)
    print(f"draw_timeline: wrote {arguments.out}")


def intervals(found, keys, window=None):
    """The (start, end) of the phases with these keys, clipped to a window if one is given."""
    spans = [(start, end) for key, start, end, tile in found if key in keys]
    if window:
        spans = [(max(start, window[0]), min(end, window[1])) for start, end in spans
                 if end > window[0] and start < window[1]]
    return spans


def periods(ready, tiles):
    """The steady tiles' periods in ns: from a tile_ready stamp to the next, per warpgroup."""
    return [(ready[j + 1] - ready[j]) * 1e3 for j in ready if steady(j, tiles) and j + 1 in ready]


def summary(path):
    """The phases of the steady tiles, per warpgroup of block 0 and over every block, as text."""
    title, blocks, clocks = read(path)
    stage = title[:2]
    labels = {key: STAGE_LABELS.get(stage, {}).get(key, label) for key, label, _, _ in PHASES}
    shape = dict(re.findall(r"\b(Lk|D)=(\d+)", title))
    # heading: ({phase: [ns per steady tile]}, [periods ns], [softmax us, of it under the other's
    # GEMM phases, of it beside the other's softmax])
    columns = {}
    notes, tile_counts = [], set()
    for block in sorted(blocks):
        rows = blocks[block]
        consumers = sorted({r["warpgroup"] for r in rows if r["warpgroup"] >= 0})
        tiles = tile_count([r for r in rows if r["warpgroup"] >= 0])
        tile_counts.add(tiles)
        found = {w: phases([r for r in rows if r["warpgroup"] == w]) for w in consumers}
        ready = {w: {r["tile"]: r["us"] for r in rows
                     if r["warpgroup"] == w and r["event"] == "tile_ready"} for w in consumers}
        for w in consumers:
            per_tile = {}
            for key, start, end, tile in found[w]:
                if steady(tile, tiles):
                    per_tile.setdefault(key, {}).setdefault(tile, 0.0)
                    per_tile[key][tile] += (end - start) * 1e3
            softmax = [(start, end) for key, start, end, tile in found[w]
                       if key == "softmax" and steady(tile, tiles)]
            others = [found[v] for v in consumers if v != w]
            times = [sum(end - start for start, end in softmax),
                     overlap(softmax, [i for f in others for i in intervals(f, GEMM_PHASES)]),
                     overlap(softmax, [i for f in others for i in intervals(f, {"softmax"})])]
            headings = [f"blocks 0-{max(blocks)}, every wg"]
            headings += [f"block 0, wg {w}"] if block == 0 else []
            for heading in headings:
                column = columns.setdefault(heading, ({}, [], [0.0, 0.0, 0.0]))
                for key, values in per_tile.items():
                    column[0].setdefault(key, []).extend(values.values())
                column[1].extend(periods(ready[w], tiles))
                for i in range(3):
                    column[2][i] += times[i]

        end = max(r["us"] for r in rows)
        first_ready = {j: min(ready[w][j] for w in consumers) for j in ready[consumers[0]]}
        last_pv = max(r["us"] for r in rows if r["warpgroup"] >= 0 and r["event"] == "pv_done")
        # No warpgroup issues or waits for a GEMM: in 08 and 09 the tensor cores then have nothing
        # of this block (one block per SM) to run; in 10 a P V may still run under its softmax.
        window = (min(ready[w][2] for w in consumers), max(ready[w][tiles - 2] for w in consumers))
        busy = overlap([window], [i for w in consumers
                                  for i in intervals(found[w], GEMM_PHASES, window)])
        note = [f"block {block}: {end:.1f} us from its first stamp to its last: "
                f"{first_ready[0]:.1f} us before a warpgroup finds tile 0 ready, "
                f"{end - last_pv:.1f} us after the last P V (the epilogue)",
                f"  steady tiles: no warpgroup issues or waits for a GEMM "
                f"{1 - busy / (window[1] - window[0]):.1%} of the time"]
        if "Lk" in shape and "D" in shape:
            keys = 16 * -(-int(shape["Lk"]) // (16 * tiles))  # BLOCK_KV: the tiles cover Lk
            flops = len(consumers) * 2 * 2 * 64 * keys * int(shape["D"])
            rate = flops / statistics.median(p for w in consumers for p in periods(ready[w], tiles))
            note.append(f"  steady tiles: {keys} keys a tile, {len(consumers)} wg x 2 GEMMs of "
                        f"64 x {keys} x {shape['D']} per median period: {rate / 1e3:.2f} TFLOP/s "
                        f"per SM ({rate / 1e3 * 132:.0f} TFLOP/s if 132 SMs ran so)")
        loaded = {r["tile"]: r["us"] for r in rows if r["warpgroup"] < 0 and r["event"] == "loaded"}
        if loaded:
            lead = [(first_ready[j] - loaded[j]) * 1e3 for j in first_ready if steady(j, tiles)]
            lead_next = [(first_ready[j + 1] - loaded[j]) * 1e3 for j in first_ready
                         if steady(j, tiles) and j + 1 in first_ready]
            note.append(f"  producer (its stamp follows the tile's V copy): tile j's loads issued "
                        f"a median {statistics.median(lead):.0f} ns before the first consumer's "
                        f"tile_ready j, {statistics.median(lead_next):.0f} ns before the first "
                        "tile_ready j+1")
        notes += note

    ordered = sorted(columns, key=lambda h: (not h.startswith("block 0"), h))
    steady_text = "; ".join(f"2 to {t - 3} of 0 to {t - 1}" for t in sorted(tile_counts))
    lines = [f"== {title} ({os.path.basename(path)})",
             "SM clock from the stamps (GHz), blocks " + ", ".join(map(str, sorted(clocks))) +
             ": " + ", ".join(f"{clocks[b]:.3f}" for b in sorted(clocks)),
             f"steady tiles: {steady_text}; per phase its median duration over those tiles (ns) "
             "and its share of their time (its sum over the sum of the tile periods)"]
    width = 40
    lines.append(" " * width + "".join(f"{heading:>22}" for heading in ordered))
    lines.append(" " * width + "".join(f"{'median ns':>13}{'share':>9}" for _ in ordered))
    for key, _, _, _ in PHASES:
        if not any(key in columns[h][0] for h in ordered):
            continue
        cells = []
        for heading in ordered:
            values, spans = columns[heading][0].get(key, []), columns[heading][1]
            cells.append(f"{statistics.median(values):13.0f}{sum(values) / sum(spans):9.1%}"
                         if values else f"{'-':>13}{'-':>9}")
        lines.append(f"{labels[key][:width - 1]:<{width}}" + "".join(cells))
    totals = [("tile period (tile_ready to tile_ready)",
               lambda c: f"{statistics.median(c[1]):13.0f}{'':9}"),
              ("  tiles counted", lambda c: f"{len(c[1]):13d}{'':9}"),
              ("softmax under the other wg's GEMMs", lambda c: f"{'':13}{c[2][1] / c[2][0]:9.1%}"),
              ("softmax beside the other wg's softmax",
               lambda c: f"{'':13}{c[2][2] / c[2][0]:9.1%}")]
    for name, cell in totals:
        lines.append(f"{name:<{width}}" + "".join(cell(columns[h]) for h in ordered))
    lines += notes
    lines.append("the other wg's GEMMs: the share of a warpgroup's softmax time during which the "
                 "other warpgroup issues wgmma or waits for them (issue, waits for S, issues P V, "
                 "waits for P V); beside its softmax: during which the other computes its softmax "
                 "too")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+")
    parser.add_argument("--out", help="the figure to write (one CSV)")
    parser.add_argument("--block", type=int, default=0)
    parser.add_argument("--tiles", type=int, nargs=2,
                        help="the tiles of the zoomed panel (first, last); default: four in the "
                             "middle of the block")
    parser.add_argument("--summary", action="store_true",
                        help="print each CSV's phase durations over the steady tiles, no figure")
    arguments = parser.parse_args()
    if arguments.summary:
        print("\n\n".join(summary(path) for path in arguments.csv))
        return
    if not arguments.out or len(arguments.csv) != 1:
        parser.error("drawing needs one CSV and --out")
    arguments.csv = arguments.csv[0]
    draw(arguments)


if __name__ == "__main__":
    main()
