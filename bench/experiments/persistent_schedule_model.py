#!/usr/bin/env python3
"""What a persistent grid can save stage 10 (stage 12's idea), from the committed benchmark run
(no GPU needed).

A model with three costs, fitted to stage 10's own forward times in a results CSV (the one-tile
grid as committed): t, the time of one K/V tile of a work tile (proportional to the keys it
covers); F, a fixed cost per block (its start: barriers, Q and the first K landing, the first
S with nothing to overlap; its end: the last P V alone, the epilogue); L, a fixed cost per call.
A grid of one-tile blocks is dispatched by the hardware in grid order (stage 06's: heads in L2
groups, the longest causal tiles first), each block to the first free SM, one block per SM.

For each of the four kernels (D = 128 with 176 keys, D = 128 causal with 128, D = 64 and D = 64
causal) the dispatch is simulated over the real work tiles of every shape of the run with
N >= 1024, F (>= 0) and t found by a grid search, L as the mean residual.

Then the persistent grid of stage 12: one block per SM, work tiles taken in the same order
(static for non-causal: block b takes b, b + 132, ...; causal: from a counter, the next one to
whichever block is free first, when there are at least four work tiles per SM, plus the
zeroing of the counter, --memset; fewer: the one-tile grid, as committed), each work tile paying
f instead of F (the epilogue staged while the next work tile's first GEMMs run, the next Q
loaded a K/V tile ahead), F once per block.
The prediction is committed / persistent for f = 0.2 and 0.8 us. It leaves out what the SASS
says about each K/V tile (fewer instructions per tile, a shorter turn): that comes on top, or
not, and is why the lab notes give a range.

usage: persistent_schedule_model.py [--results CSV] [--sms 132] [--l2 BYTES] [--memset US]
"""
import argparse
import csv
import heapq
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "..", "results", "nvidia-h100-80gb-hbm3", "results.csv")
PROBE = [(1, 8, 4096, 8192, 128, 0), (1, 32, 4096, 4096, 128, 0), (1, 32, 1024, 1024, 128, 0),
         (16, 16, 4096, 4096, 128, 1), (1, 32, 4096, 4096, 128, 1), (1, 32, 16384, 16384, 128, 1),
         (1, 32, 1024, 1024, 128, 1), (4, 8, 4096, 4096, 64, 0), (4, 8, 4096, 4096, 64, 1),
         (4, 8, 1024, 1024, 64, 1)]


def tiling(head_dim, causal):
    """(BLOCK_Q, BLOCK_KV) of stage 10's kernel for the shape."""
    return (192, 128) if head_dim == 64 else (128, 128) if causal else (128, 176)


def group_heads(batch_heads, len_kv, head_dim, l2):
    kv_bytes = 2 * len_kv * head_dim * 2
    if batch_heads * kv_bytes <= l2:
        return batch_heads
    return max(1, min(batch_heads, l2 // 2 // kv_bytes))


def work_tiles(shape, l2):
    """The K/V tiles (fractional at a ragged end) of every work tile, in stage 06's order."""
    batch, heads, len_q, len_kv, head_dim, causal = shape
    block_q, block_kv = tiling(head_dim, causal)
    q_tiles, batch_heads = math.ceil(len_q / block_q), batch * heads
    group = group_heads(batch_heads, len_kv, head_dim, l2)
    tiles = []
    for tile in range(batch_heads * q_tiles):
        rank = tile % (group * q_tiles)
        first_head = tile // (group * q_tiles) * group
        in_group = min(group, batch_heads - first_head)
        q_block = q_tiles - 1 - rank // in_group
        keys = min(len_kv, q_block * block_q + block_q) if causal else len_kv
        tiles.append(keys / block_kv)
    return tiles


def greedy(costs, sms):
    free = [0.0] * sms
    for cost in costs:
        heapq.heapreplace(free, free[0] + cost)
    return max(free)


def static(costs, sms):
    loads = [0.0] * sms
    for i, cost in enumerate(costs):
        loads[i % sms] += cost
    return max(loads)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--l2", type=int, default=50 * 1024 * 1024)
    parser.add_argument("--memset", type=float, default=2.0,
                        help="us the zeroing of the causal tile counter adds to a call (a guess)")
    arguments = parser.parse_args()
    sms, l2 = arguments.sms, arguments.l2
    measured = {}
    with open(arguments.results) as results:
        for row in csv.DictReader(results):
            if row["stage"] == "10_pingpong" and row["pass"] == "fwd" and row["status"] == "ok":
                shape = tuple(int(row[k]) for k in ("batch", "heads", "len_q", "len_kv", "head_dim", "causal"))
                measured[shape] = float(row["median_ms"]) * 1000
    print(f"# bench/experiments/persistent_schedule_model.py on {os.path.relpath(arguments.results)} "
          f"(stage 10's forward, us), {sms} SMs, {l2 >> 20} MiB of L2")
    fits = {}
    for name, head_dim, causal, t_range in (("D = 128, 176 keys, non-causal", 128, 0, (1800, 2600)),
                                            ("D = 128, 128 keys, causal", 128, 1, (1200, 2000)),
                                            ("D = 64, non-causal", 64, 0, (1000, 1800)),
                                            ("D = 64, causal", 64, 1, (1000, 1800))):
        shapes = sorted(s for s in measured if s[4] == head_dim and s[5] == causal and s[2] >= 1024)
        tiles = {s: work_tiles(s, l2) for s in shapes}
        best = None
        for F10 in range(0, 61, 2):  # F >= 0: a block cannot start and end in negative time
            for t1000 in range(*t_range, 10):
                t, F = t1000 / 1000, F10 / 10
                model = {s: greedy([k * t + F for k in tiles[s]], sms) for s in shapes}
                L = sum(measured[s] - model[s] for s in shapes) / len(shapes)
                error = sum((measured[s] - model[s] - L) ** 2 for s in shapes)
                if best is None or error < best[0]:
                    best = (error, t, F, L, model)
        _, t, F, L, model = best
        fits[(head_dim, causal)] = (t, F, L)
        print(f"{name}: t = {t:.3f} us a K/V tile, F = {F:.1f} us a block, L = {L:.1f} us a call "
              f"(grid search over " + ", ".join("x".join(str(v) for v in s[:4]) for s in shapes) +
              "; residuals " + ", ".join(f"{measured[s] - model[s] - L:+.1f}" for s in shapes) + ")")
    print()
    print("shape                      measured  model(grid)  persistent f=0.2  f=0.8   committed/persistent")
    for s in PROBE:
        head_dim, causal = s[4], s[5]
        t, F, L = fits[(head_dim, causal)]
        kv = work_tiles(s, l2)
        grid = L + greedy([k * t + F for k in kv], sms)
        counted = causal and len(kv) >= 4 * sms  # the launcher's rule
        result = []
        for f in (0.2, 0.8):
            costs = [k * t + f for k in kv]
            if causal and not counted:  # the one-tile grid, as committed
                result.append(grid)
            elif counted:
                result.append(L + F + arguments.memset + greedy(costs, sms))
            else:
                result.append(L + F + static(costs, sms))
        if causal:  # what taking the tiles in a fixed order (block b: b, b + 132, ...) would give
            static_costs = [k * t + 0.2 for k in kv]
            result_static = L + F + static(static_costs, sms) if len(kv) > sms else grid
        tag = "x".join(str(v) for v in s)
        print(f"{tag:26s} {measured.get(s, float('nan')):9.1f} {grid:11.1f} {result[0]:13.1f} {result[1]:9.1f}"
              f"   {grid / result[1]:.3f} - {grid / result[0]:.3f}{'  (counter)' if counted else '  (one-tile grid)' if causal else ''}"
              + (f"; a fixed order instead, f = 0.2: {grid / result_static:.3f}" if causal else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
