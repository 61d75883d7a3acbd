#!/usr/bin/env python3
"""The ring's results as a table, from one CSV of 13_ring_attention's benchmark (bench_ring.cpp's
columns; bench/torch_context_parallel.py writes PyTorch's rows in the same ones), for the
chapter: one CSV is one device call, so that a table never mixes runs.

    python3 bench/ring_table.py CSV --out TABLE.txt     write the table
    python3 bench/ring_table.py CSV --out TABLE.txt --check
                                                        fail if TABLE.txt is not what CSV gives

Per GPU count, length, mask, sharding and pass: the median time of a call, per-GPU TFLOP/s,
the rate of the ring's own kernel alone on the machine (the CSV's baseline: bench_ring.cpp says
which kernel and how it is timed) and their ratio, the
course's 90% target beside it, the A/A ratio (the ring's second call in each round over its
first, where the CSV has it); and where the CSV has PyTorch's context parallelism at the same
GPU count, length, mask and pass, its time (the median over its rounds) and the ring's speed
over it, with the spread of PyTorch's rounds below the table. Only rows whose status is `ok`.
"""

import argparse
import csv
import os
import statistics
import sys

TARGET = 0.90
TORCH = "torch_cp_"


def read_rows(paths, timed=True):
    """The rows of the CSVs, each with its file's name: those of status ok (timed), or the others."""
    rows = []
    for path in paths:
        with open(path) as source:
            for row in csv.DictReader(source):
                if (row.get("status") == "ok") == timed:
                    row["file"] = os.path.basename(path)
                    rows.append(row)
    return rows


def same_point(a, b):
    return all(a[k] == b[k] for k in ("gpu", "gpus", "len", "head_dim", "causal", "pass"))


def collapse_rounds(rows):
    """PyTorch's rows of one point timed in several rounds (`make bench-ring` times the first
    length before and after the ring's rows) as one row: the median of the rounds' medians and
    rates, with `rounds` (their count) and `spread` (the slowest round's time over the fastest's,
    PyTorch's A/A). Every other row as it is."""
    collapsed, seen = [], []
    for row in rows:
        if not row["sharding"].startswith(TORCH):
            collapsed.append(row)
            continue
        if any(same_point(row, other) and row["sharding"] == other["sharding"] for other in seen):
            continue
        seen.append(row)
        group = [r for r in rows if r["sharding"] == row["sharding"] and same_point(r, row)]
        times = [float(r["median_ms"]) for r in group]
        merged = dict(row)
        merged["median_ms"] = str(statistics.median(times))
        merged["tflops_per_gpu"] = str(statistics.median(float(r["tflops_per_gpu"]) for r in group))
        merged["rounds"], merged["spread"] = len(group), max(times) / min(times)
        collapsed.append(merged)
    return collapsed


def aa_ratio(row):
    """The ring's A/A: the median of its second call in each round over its first's; None for a
    row without one (PyTorch's, or a CSV from before the column)."""
    again = row.get("aa_median_ms") or ""
    return float(again) / float(row["median_ms"]) if again else None


def efficiency(row, rows):
    """The row's efficiency, or for a row without a baseline (PyTorch's), its per-GPU rate over
    the baseline's at the same GPU count, length, head dim and mask from another row, else None."""
    if row["efficiency"]:
        return float(row["efficiency"])
    for other in rows:
        if other["baseline_tflops"] and same_point(other, row):
            return float(row["tflops_per_gpu"]) / float(other["baseline_tflops"])
    return None


def table(path):
    rows = collapse_rounds(read_rows([path]))
    ring = [r for r in rows if not r["sharding"].startswith(TORCH)]
    torch = [r for r in rows if r["sharding"].startswith(TORCH)]
    order = lambda r: (int(r["gpus"]), int(r["len"]), -int(r["causal"]), r["sharding"], r["pass"] != "fwd")
    with_aa = any(aa_ratio(r) is not None for r in ring)  # CSVs before the A/A column have none
    gpus = sorted({r["gpu"] for r in rows})
    heads = "; ".join(f"B = {b}, H = {h}, D = {d}" for b, h, d in
                      sorted({(r["batch"], r["heads"], r["head_dim"]) for r in rows}))
    lines = [f"{', '.join(gpus)}; {heads}; rows of {os.path.basename(path)}",
             "(bench/ring_table.py). Efficiency: per-GPU TFLOP/s over the ring's own kernel alone (no",
             f"ring) at the length in column `at` (target {TARGET:.2f}); vs PyTorch: PyTorch's context",
             "parallelism's time over the ring's.",
             "",
             f"{'GPUs':>4} {'tokens':>8} {'per GPU':>8} {'mask':<10} {'sharding':<10} {'pass':<4} "
             f"{'ms':>9} {'TFLOP/s':>8} {'alone':>7} {'at':>7} {'effic.':>6}"
             f"{' ' + format('A/A', '>6') if with_aa else ''}  {'PyTorch ms':>10} {'vs PyTorch':>10}"]
    for r in sorted(ring, key=order):
        tokens, count = int(r["len"]), int(r["gpus"])
        cp = [t for t in torch if same_point(t, r)]
        cp_cells = (f"{float(cp[0]['median_ms']):>10.1f} {float(cp[0]['median_ms']) / float(r['median_ms']):>9.3f}x"
                    if cp else f"{'':>10} {'':>10}")
        lines.append(f"{count:>4} {tokens:>8} {tokens // count:>8} "
                     f"{'causal' if r['causal'] == '1' else 'non-causal':<10} {r['sharding']:<10} {r['pass']:<4} "
                     f"{float(r['median_ms']):>9.1f} {float(r['tflops_per_gpu']):>8.1f} "
                     f"{float(r['baseline_tflops']):>7.1f} {int(r['baseline_len']):>7} "
                     f"{float(r['efficiency']):>6.3f}"
                     f"{' ' + format(aa_ratio(r) or float('nan'), '6.3f') if with_aa else ''}  {cp_cells}")
    ratios = [aa_ratio(r) for r in ring if aa_ratio(r) is not None]
    if ratios:
        lines += ["", f"A/A: the ring's second call in each round over its first, median over the rounds: "
                      f"{min(ratios):.3f} to {max(ratios):.3f} over {len(ratios)} rows "
                      f"({sum(abs(x - 1) <= 0.02 for x in ratios)} within 2%)"]
    for t in sorted((t for t in torch if t.get("rounds", 1) > 1), key=order):
        lines.append(f"PyTorch in {t['rounds']} rounds (before and after the ring's rows) at {t['gpus']} GPUs, "
                     f"{t['len']} tokens, {'causal' if t['causal'] == '1' else 'non-causal'}, {t['pass']}: "
                     f"slowest over fastest {t['spread']:.3f}")
    for row in read_rows([path], timed=False):
        lines.append(f"not timed: {row['gpus']} GPUs, {row['len']} tokens, {row['sharding']}, "
                     f"causal {row['causal']}, {row['pass']}: {row['status']}")
    unmatched = [t for t in torch if not any(same_point(t, r) for r in ring)]
    for t in unmatched:
        lines.append(f"PyTorch's row without a ring row at its point: {t['gpus']} GPUs, {t['len']} tokens, "
                     f"causal {t['causal']}, {t['pass']}: {float(t['median_ms']):.1f} ms")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--out", required=True)
    parser.add_argument("--check", action="store_true")
    arguments = parser.parse_args()
    text = table(arguments.csv)
    if arguments.check:
        with open(arguments.out) as current:
            if current.read() != text:
                print(f"ring_table: {arguments.out} is stale (python3 bench/ring_table.py "
                      f"{arguments.csv} --out {arguments.out})", file=sys.stderr)
                return 1
        return 0
    with open(arguments.out, "w") as out:
        out.write(text)
    print(f"ring_table: wrote {arguments.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
