#!/usr/bin/env python3
"""Draws the schedule of one block of a Hopper stage as it ran: one row per warpgroup, a bar per
phase, from the stamps bench/experiments/timeline.cu writes (common/timeline.cuh names the
events); with --summary, prints the phases' durations instead, per stage, over the steady tiles.
The CSV's first line says the pass: the forward of 08, 09, 10 and 12 walks K/V tiles (a block of
12 walks several work tiles, its K/V tiles numbered on from one to the next), the backward of 11
query tiles. Each bar spans two consecutive stamps of a warpgroup, coloured by what lies
between. The forward:

  tile_ready -> turn                    waiting for its turn to issue (stage 10's ping-pong)
  turn / tile_ready -> issued           issuing wgmma: S (and, in 10, P V of the previous tile)
  softmax_done -> issued                issuing P V (in 09 after waiting for V)
  issued -> s_done                      waiting for S from the tensor cores
  s_done -> softmax_done                the softmax (08 and 09 also rescale O in it)
  softmax_done / issued -> pv_done      waiting for P V
  pv_done / start -> tile_ready         what lies between P V and the next tile: 08's
                                        __syncthreads, 09's release of V, 10's rescale of O
                                        and packing of P; then waiting for K (and V)
The backward (stage 11; each consumer takes two turns at the tensor cores per query tile):

  tile_ready -> turn                    waiting for its first turn
  turn -> issued                        issuing S^T = K Q^T and dP^T = V dO^T
  issued -> s_done                      waiting for S^T
  s_done -> p_done                      P^T = exp(S^T - LSE) (with the mask where the tile has one)
  p_done -> dp_done                     waiting for dP^T
  dp_done -> ds_stored                  delta (exact, where one block holds every key), dS^T,
                                        dS^T stored to shared memory for dQ
  ds_stored -> gradients_turn           waiting for its second turn
  gradients_turn -> gradients_issued    issuing dK += dS^T Q, dV += P^T dO and a piece of dQ
  gradients_issued -> gradients_done    waiting for them; then the Q, dO stage goes back
  gradients_done -> dq_handed           handing the piece of dQ over (staging, bulk reduce-add)
  dq_handed / start -> tile_ready       waiting for the next query tile's Q, dO, LSE, delta
                                        (before the first: K and V, the column sums of K)
A tile's phases run from its tile_ready stamp to the next one (stage 10 stamps pv_done with the
previous tile's number; it still belongs to the tile in whose loop it is; in 11 consumer 0's
piece of dQ is the previous tile's, stamped with the loop's). One thread, lane 0 of the
warpgroup's first warp, stamps for the warpgroup. The producer's row marks each tile's loads as
issued (a CSV whose producer stamps only its start and its end gets a bar between the two).
Cycles become microseconds through a straight-line fit of the stamps' %globaltimer nanoseconds
against their clock64 cycles, per block (each block has its own SM's clock).

The summary takes the steady tiles (all but the first two and the last two) of every block and
prints per phase its median duration and its share of the tile, the tile period, how much of a
warpgroup's softmax (11: P^T and dS^T) runs beside the other's GEMM phases and beside its own
kind of phase, and per block its length, its ends and the GEMM work of its steady tiles. For the
backward it also says what the other consumer does during each consumer's P^T, dS^T and
hand-over of dQ: its phases' shares of that time, over every block.

usage: draw_timeline.py timeline.csv --out figure.png [--block 0] [--tiles 21 24] [--summary]
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
BACKWARD_PHASES = [
    ("turn", "waits for its first turn", "#d9d9d9", {("tile_ready", "turn")}),
    ("issue", "issues S^T, dP^T", "#1f4e79", {("turn", "issued")}),
    ("wait_s", "waits for S^T", "#9ecae1", {("issued", "s_done")}),
    ("exp", "P^T = exp(S^T - LSE)", "#c0392b", {("s_done", "p_done")}),
    ("wait_dp", "waits for dP^T", "#f4d03f", {("p_done", "dp_done")}),
    ("ds", "delta, dS^T, stores dS^T", "#e67e22", {("dp_done", "ds_stored")}),
    ("turn2", "waits for its second turn", "#9e9e9e", {("ds_stored", "gradients_turn")}),
    ("issue_grad", "issues dK, dV, dQ", "#6a9fd4", {("gradients_turn", "gradients_issued")}),
    ("wait_grad", "waits for dK, dV, dQ, releases Q, dO", "#c9b037",
     {("gradients_issued", "gradients_done")}),
    ("dq", "hands dQ over (to its writer)", "#8e44ad", {("gradients_done", "dq_handed")}),
    ("after", "waits for the next Q, dO (first: K, V)", "#a5d6a7",
     {("dq_handed", "tile_ready"), ("start", "tile_ready")}),
]
# What differs between the passes: the phases, which of them are the warpgroup's GEMMs (queued
# or running), which the work between the GEMMs that the ping-pong hides, the event after a
# tile's last GEMM, and the words.
PASSES = {
    "forward": {
        "phases": PHASES, "gemm": {"issue", "wait_s", "issue_pv", "wait_pv"},
        "compute": {"softmax"}, "compute_name": "softmax", "last_gemm": "pv_done",
        "last_gemm_name": "P V", "tile_name": "K/V tile", "ready": "its K, V ready",
        "loads": "K and V", "last_load": "V", "legend_columns": 3,
        "gemm_words": "issue, waits for S, issues P V, waits for P V",
    },
    "backward": {
        "phases": BACKWARD_PHASES,
        "gemm": {"issue", "wait_s", "wait_dp", "issue_grad", "wait_grad"},
        "compute": {"exp", "ds"}, "compute_name": "P^T, dS^T", "last_gemm": "gradients_done",
        "last_gemm_name": "gradients", "tile_name": "query tile", "ready": "its Q, dO ready",
        "loads": "Q, dO, LSE and delta", "last_load": "delta", "legend_columns": 4,
        "gemm_words": "issues S^T, dP^T, waits for S^T, waits for dP^T, issues dK, dV, dQ, "
                      "waits for them",
    },
}
for _pass in PASSES.values():
    _pass["phase"] = {pair: key for key, _, _, pairs in _pass["phases"] for pair in pairs}
    _pass["colour"] = {key: colour for key, _, colour, _ in _pass["phases"]}
# What a phase holds differs between the stages; the legend and the table say it for the stage.
STAGE_LABELS = {
    "08": {"softmax": "softmax, rescales O", "after": "__syncthreads, waits for K, V"},
    "09": {"softmax": "softmax, rescales O", "issue_pv": "waits for V, issues P V",
           "after": "releases V, waits for K"},
    "10": {"issue": "issues S and the previous tile's P V",
           "after": "rescales O, packs P, waits for K, V"},
}
STAGE_LABELS["12"] = STAGE_LABELS["10"]  # 10's loop; a work tile's first K/V tile also stages O
# Stages whose blocks walk several work tiles: there Lk over the block's K/V tiles is not the
# keys of one tile, and the summary leaves out the GEMM rate it would derive from it.
PERSISTENT_STAGES = {"12"}


def in_walk_order(stamps):
    """Numbers a block's tiles by the order it walks them where that is not their index order:
    stage 11's deterministic backward starts a block's walk at a query tile that depends on its
    key block and wraps round (dq_order.h), so its tile 0 can come last but one. The tiles that
    stamped tile_ready become their rank in time (from the block's first tile's number on), the
    producer's loads and the end stamp keep their meaning: the loads take the rank of their tile,
    the end stamp counts the tiles. Blocks walked in index order are left as they are."""
    ready = {}
    for r in stamps:
        if r["event"] == "tile_ready" and r["warpgroup"] >= 0:
            ready[r["tile"]] = min(ready.get(r["tile"], r["cycle"]), r["cycle"])
    walk = sorted(ready, key=ready.get)
    if walk == sorted(walk):
        return
    rank = {tile: min(walk) + i for i, tile in enumerate(walk)}
    for r in stamps:
        if r["event"] != "end" and r["tile"] in rank:
            r["tile"] = rank[r["tile"]]


def pass_of(title):
    """The pass the CSV's first line names ('11_hopper_backward backward, B=1 ...'): forward
    unless it says backward (the CSVs of 08-10 and 12 say forward)."""
    words = title.split(",")[0].split()
    return PASSES["backward" if len(words) > 1 and words[1] == "backward" else "forward"]


def read(path):
    """The stamps of every block, each with its time in microseconds since its block's first
    stamp, and per block the SM clock the fit gives (GHz). The CSV's first line names the stage,
    the pass and the shape."""
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
        in_walk_order(stamps)
    return title, blocks, clocks


def phases(stamps, kind, first=0):
    """A consumer's stamps as phases: (key, start us, end us, tile), the tile being the one whose
    tile_ready stamp last came before the phase (`first` before the first)."""
    stamps = sorted(stamps, key=lambda r: r["cycle"])
    found, tile = [], first
    for before, after in zip(stamps, stamps[1:]):
        if before["event"] == "tile_ready":
            tile = before["tile"]
        key = kind["phase"].get((before["event"], after["event"]))
        if key:
            found.append((key, before["us"], after["us"], tile))
    return found


def tile_range(stamps):
    """The consumers' tiles: (first, end), the first tile_ready's tile and the end stamp's (the
    number of tiles: 08-10's and 12's K/V tiles; 11's query tiles, of which a causal block walks
    those from `first`)."""
    return (min(r["tile"] for r in stamps if r["event"] == "tile_ready"),
            max(r["tile"] for r in stamps if r["event"] == "end"))


def steady(tile, tiles):
    """The steady state: leave out the first two tiles (the ring filling) and the last two;
    tiles is (first, end)."""
    first, end = tiles
    return first + 2 <= tile <= end - 3


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
    kind = pass_of(title)
    stage = title[:2]
    labels = {key: STAGE_LABELS.get(stage, {}).get(key, label)
              for key, label, _, _ in kind["phases"]}
    # (Stage 11's dQ writer, warpgroup -2, where its stamps are patched in: in the summary only.)
    warpgroups = sorted({r["warpgroup"] for r in rows if r["warpgroup"] >= -1})
    has_producer = warpgroups[0] < 0
    consumer = "consumer" if has_producer else "warpgroup"
    walk = tile_range([r for r in rows if r["warpgroup"] >= 0])
    tiles = walk[1] - walk[0]
    middle = walk[0] + tiles // 2
    first, last = arguments.tiles if arguments.tiles else (middle - 2, middle + 1)
    has_loads = any(r["event"] == "loaded" for r in rows if r["warpgroup"] < 0)

    found = {w: phases([r for r in rows if r["warpgroup"] == w], kind, walk[0])
             for w in warpgroups if w >= 0}
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
            if warpgroup < 0 and not has_loads:  # 11: its start and its last load
                ends = [r["us"] for r in rows if r["warpgroup"] == warpgroup
                        and r["event"] in ("start", "end")]
                ax.barh(y, max(ends) - min(ends), left=min(ends), height=0.25, color="#2e7d32")
                continue
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
                ax.barh(y, end - start, left=start, height=0.6, color=kind["colour"][key],
                        edgecolor="white" if zoom else "none", linewidth=0.4)
            for r in rows if zoom else []:
                if (r["warpgroup"] == warpgroup and r["event"] == "tile_ready"
                        and first <= r["tile"] <= last):
                    ax.text(r["us"], y - 0.34, f"tile {r['tile']}", fontsize=6.5, color="#333")
        ax.set_yticks(range(len(warpgroups)))
        ax.set_yticklabels(["producer" if w < 0 else f"{consumer} {w}" for w in warpgroups])
        ax.set_ylim(len(warpgroups) - 0.5, -0.6)
        ax.set_xlabel("microseconds since the block's first stamp")
        # The tiles of the walk, as 08-10's titles had them (their walks start at tile 0).
        span = f"{tiles}" if walk[0] == 0 else f"{tiles} ({walk[0]} to {walk[1] - 1})"
        if zoom:
            ax.set_xlim(*zoom_range)
            ax.set_title(f"tiles {first} to {last} of {span}, in the steady state: a tile runs "
                         f"from {kind['ready']} to the next tile's" +
                         ("; above the producer's marks, the tile loaded"
                          if has_producer and has_loads else ""), fontsize=8.5)
        else:
            ax.set_xlim(left=0)
            ax.set_title(f"{title}\nblock {arguments.block}, all {span} {kind['tile_name']}s; "
                         f"SM clock {clocks[arguments.block]:.2f} GHz from the stamps (the phase "
                         "stamps cost time themselves)", fontsize=9)
    axes[0].axvspan(*zoom_range, color="#000000", alpha=0.08, zorder=0)
    keys = [key for key, _, _, _ in kind["phases"] if key in seen]
    handles = [plt.Rectangle((0, 0), 1, 1, color=kind["colour"][key]) for key in keys]
    names = [labels[key] for key in keys]
    if has_producer and has_loads:
        handles.append(plt.Line2D([], [], marker="|", ls="", color="#2e7d32", ms=10, mew=1.5))
        names.append(f"producer: a tile's {kind['loads']} loads issued")
    elif has_producer:
        handles.append(plt.Rectangle((0, 0), 1, 1, color="#2e7d32"))
        names.append("producer: from its start to its last load issued")
    fig.legend(handles, names, loc="lower center", ncol=kind["legend_columns"], frameon=False,
               fontsize=8)
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


WRITER_PHASES = [("turn", "waits for the tile's turn (deterministic: the semaphore)"),
                 ("staged", "waits for the consumer's piece"),
                 ("read", "issues the reduce-adds, waits for their read"),
                 ("released", "waits for their completion, releases the turn")]


def writer_lines(blocks):
    """Stage 11's dQ writer of consumer 0 (warpgroup -2, where its stamps are compiled in): per
    steady tile, the median ns of each of its phases over the blocks, each phase ending at its
    stamp and starting at the stamp before (the first: the previous tile's last stamp)."""
    durations = {key: [] for key, _ in WRITER_PHASES}
    for rows in blocks.values():
        consumers = [r for r in rows if r["warpgroup"] >= 0]
        writer = sorted((r for r in rows if r["warpgroup"] == -2), key=lambda r: r["cycle"])
        if not writer or not consumers:
            continue
        tiles = tile_range(consumers)
        previous = None
        for r in writer:
            key = r["event"][len("dq_"):]
            if previous is not None and key in durations and steady(r["tile"], tiles):
                durations[key].append((r["us"] - previous) * 1e3)
            previous = r["us"]
    if not any(durations.values()):
        return []
    lines = [f"consumer 0's dQ writer, steady tiles of blocks 0-{max(blocks)}: median ns per phase"]
    for key, label in WRITER_PHASES:
        values = durations[key]
        lines.append(f"  {label:<56}" + (f"{statistics.median(values):8.0f}" if values else f"{'-':>8}"))
    return lines


def summary(path):
    """The phases of the steady tiles, per warpgroup of block 0 and over every block, as text."""
    title, blocks, clocks = read(path)
    kind = pass_of(title)
    backward = kind is PASSES["backward"]
    stage = title[:2]
    labels = {key: STAGE_LABELS.get(stage, {}).get(key, label)
              for key, label, _, _ in kind["phases"]}
    compute = kind["compute_name"]
    shape = dict(re.findall(r"\b(Lq|Lk|D)=(\d+)", title))
    # heading: ({phase: [ns per steady tile]}, [periods ns], [softmax us, of it under the other's
    # GEMM phases, of it beside the other's softmax])
    columns = {}
    notes, tile_counts = [], set()
    beside = {}  # backward: (consumer, its phase) -> [its us, {the other's phase: us beside it}]
    for block in sorted(blocks):
        rows = blocks[block]
        consumers = sorted({r["warpgroup"] for r in rows if r["warpgroup"] >= 0})
        tiles = tile_range([r for r in rows if r["warpgroup"] >= 0])
        first, end_tile = tiles
        tile_counts.add(tiles)
        found = {w: phases([r for r in rows if r["warpgroup"] == w], kind, first)
                 for w in consumers}
        ready = {w: {r["tile"]: r["us"] for r in rows
                     if r["warpgroup"] == w and r["event"] == "tile_ready"} for w in consumers}
        for w in consumers:
            per_tile = {}
            for key, start, end, tile in found[w]:
                if steady(tile, tiles):
                    per_tile.setdefault(key, {}).setdefault(tile, 0.0)
                    per_tile[key][tile] += (end - start) * 1e3
            softmax = [(start, end) for key, start, end, tile in found[w]
                       if key in kind["compute"] and steady(tile, tiles)]
            others = [found[v] for v in consumers if v != w]
            times = [sum(end - start for start, end in softmax),
                     overlap(softmax, [i for f in others for i in intervals(f, kind["gemm"])]),
                     overlap(softmax, [i for f in others for i in intervals(f, kind["compute"])])]
            headings = [f"blocks 0-{max(blocks)}, every wg"]
            headings += [f"block 0, wg {w}"] if block == 0 else []
            for heading in headings:
                column = columns.setdefault(heading, ({}, [], [0.0, 0.0, 0.0]))
                for key, values in per_tile.items():
                    column[0].setdefault(key, []).extend(values.values())
                column[1].extend(periods(ready[w], tiles))
                for i in range(3):
                    column[2][i] += times[i]
            for key in ("exp", "ds", "dq") if backward else ():
                mine = [(start, end) for k, start, end, tile in found[w]
                        if k == key and steady(tile, tiles)]
                entry = beside.setdefault((w, key), [0.0, {}])
                entry[0] += sum(end - start for start, end in mine)
                for other, _, _, _ in kind["phases"]:
                    entry[1][other] = entry[1].get(other, 0.0) + overlap(
                        mine, [i for f in others for i in intervals(f, {other})])

        end = max(r["us"] for r in rows)
        first_ready = {j: min(ready[w][j] for w in consumers) for j in ready[consumers[0]]}
        last_pv = max(r["us"] for r in rows
                      if r["warpgroup"] >= 0 and r["event"] == kind["last_gemm"])
        # No warpgroup issues or waits for a GEMM: in 08 and 09 the tensor cores then have nothing
        # of this block (one block per SM) to run; in 10 a P V may still run under its softmax,
        # in 11 a consumer's dP^T under its P^T.
        window = (min(ready[w][first + 2] for w in consumers),
                  max(ready[w][end_tile - 2] for w in consumers))
        busy = overlap([window], [i for w in consumers
                                  for i in intervals(found[w], kind["gemm"], window)])
        note = [f"block {block}: {end:.1f} us from its first stamp to its last: "
                f"{first_ready[first]:.1f} us before a warpgroup finds tile {first} ready, "
                f"{end - last_pv:.1f} us after the last {kind['last_gemm_name']} (the epilogue)",
                f"  steady tiles: no warpgroup issues or waits for a GEMM "
                f"{1 - busy / (window[1] - window[0]):.1%} of the time"]
        if backward and "Lq" in shape and "D" in shape:
            # Stage 11: per query tile a consumer issues S^T, dP^T (64 keys x BLOCK_Q x D each),
            # dV, dK (64 x D x BLOCK_Q) and a 64 x 64 piece of dQ over the block's 64 x
            # consumers keys; the row sums of dS (N = 8) are left out. BLOCK_Q: the query tiles
            # (the end stamp's count) cover Lq.
            queries = 16 * -(-int(shape["Lq"]) // (16 * end_tile))
            head_dim, keys = int(shape["D"]), 64 * len(consumers)
            flops = len(consumers) * (4 * 2 * 64 * queries * head_dim + 2 * 64 * 64 * keys)
            rate = flops / statistics.median(p for w in consumers for p in periods(ready[w], tiles))
            note.append(f"  steady tiles: {queries} queries a tile, {len(consumers)} wg x (4 GEMMs "
                        f"of 64 x {queries} x {head_dim} and dQ's 64 x 64 x {keys}) per median "
                        f"period: {rate / 1e3:.2f} TFLOP/s per SM ({rate / 1e3 * 132:.0f} "
                        "TFLOP/s if 132 SMs ran so)")
        elif not backward and stage in PERSISTENT_STAGES:
            note.append("  steady tiles: the block walks several work tiles, so its K/V tiles do "
                        "not divide Lk: no GEMM rate")
        elif not backward and "Lk" in shape and "D" in shape:
            keys = 16 * -(-int(shape["Lk"]) // (16 * end_tile))  # BLOCK_KV: the tiles cover Lk
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
            note.append(f"  producer (its stamp follows the tile's {kind['last_load']} copy): tile j's "
                        "loads issued "
                        f"a median {statistics.median(lead):.0f} ns before the first consumer's "
                        f"tile_ready j, {statistics.median(lead_next):.0f} ns before the first "
                        "tile_ready j+1")
        elif any(r["warpgroup"] < 0 for r in rows):
            producer = [r["us"] for r in rows if r["warpgroup"] < 0]
            note.append(f"  producer: no stamp per tile; its start at {min(producer):.1f} us, its "
                        f"last load issued at {max(producer):.1f} us")
        notes += note

    ordered = sorted(columns, key=lambda h: (not h.startswith("block 0"), h))
    steady_text = "; ".join(f"{f + 2} to {t - 3} of {f} to {t - 1}" for f, t in sorted(tile_counts))
    lines = [f"== {title} ({os.path.basename(path)})",
             "SM clock from the stamps (GHz), blocks " + ", ".join(map(str, sorted(clocks))) +
             ": " + ", ".join(f"{clocks[b]:.3f}" for b in sorted(clocks)),
             f"steady tiles: {steady_text}; per phase its median duration over those tiles (ns) "
             "and its share of their time (its sum over the sum of the tile periods)"]
    width = 40
    lines.append(" " * width + "".join(f"{heading:>22}" for heading in ordered))
    lines.append(" " * width + "".join(f"{'median ns':>13}{'share':>9}" for _ in ordered))
    for key, _, _, _ in kind["phases"]:
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
              (f"{compute} under the other wg's GEMMs",
               lambda c: f"{'':13}{c[2][1] / c[2][0]:9.1%}"),
              (f"{compute} beside the other wg's {compute}",
               lambda c: f"{'':13}{c[2][2] / c[2][0]:9.1%}")]
    for name, cell in totals:
        lines.append(f"{name:<{width}}" + "".join(cell(columns[h]) for h in ordered))
    if beside:
        lines.append(f"beside a consumer's phase, the other consumer's phases (their shares of that "
                     f"time, steady tiles of blocks 0-{max(blocks)}; shares under 1% left out):")
        order = [key for key, _, _, _ in kind["phases"]]
        for (w, key), (total, others) in sorted(beside.items(),
                                                key=lambda item: (item[0][0], order.index(item[0][1]))):
            shares = [f"{labels[other]} {time / total:.0%}" for other, _, _, _ in kind["phases"]
                      for time in [others[other]] if total and time / total >= 0.01]
            lines.append(f"  consumer {w}, {labels[key]}: " + "; ".join(shares))
    lines += notes
    lines += writer_lines(blocks)
    lines.append(f"the other wg's GEMMs: the share of a warpgroup's {compute} time during which the "
                 f"other warpgroup issues wgmma or waits for them ({kind['gemm_words']}); beside "
                 f"its {compute}: during which the other computes its {compute} too")
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
                        help="print each CSV's phase durations over the steady tiles (with --out, "
                             "after drawing the figure)")
    arguments = parser.parse_args()
    if not arguments.summary and not arguments.out:
        parser.error("give --out (one CSV) or --summary")
    if arguments.out and len(arguments.csv) != 1:
        parser.error("drawing needs one CSV and --out")
    paths = arguments.csv
    if arguments.out:
        arguments.csv = paths[0]
        draw(arguments)
    if arguments.summary:
        print("\n\n".join(summary(path) for path in paths))


if __name__ == "__main__":
    main()
