"""Summarises the CSVs of build/experiments/timeline_spans_11_hopper_backward: when each block of
stage 11's backward started and ended (the GPU's nanosecond timer, from the grid's first stamp).

Per CSV: the grid's time from the first block's first stamp to the last block's last, the
blocks' spans (median, fastest, slowest, and how many fall in each 10 us bin), the gap from a
block's end to the next one's start on its SM and the spans round by round (--sms blocks at a
time, in the order they started), how far the dQ
writer of consumer 0 runs past the block's consumers, and the blocks that took more than 1.5
times the median span, with when they started.

    make -C bench/experiments spans
    build/experiments/timeline_spans_11_hopper_backward 1 8 4096 8192 128 0 1 > spans.csv   (an H100)
    python3 bench/experiments/block_spans.py spans.csv [more.csv ...]
"""

import argparse
import collections
import csv
import statistics


def rounds(start, end, span, sms):
    """The blocks in the order they started, `sms` at a time (one block per SM: a round), and the
    gap between an SM's block ending and the next block starting there: the k-th block to start
    after the first round takes the SM the k-th block to end left (the hardware hands the next
    block to the first SM free), so the gap is the k-th start after the first round less the
    k-th end."""
    order = sorted(start, key=lambda b: start[b])
    starts, ends = [start[b] for b in order], sorted(end.values())
    lines = []
    if len(order) > sms:
        gaps = sorted(starts[sms + k] - ends[k] for k in range(len(order) - sms))
        lines.append(f"from a block's end to the next block's start on that SM (us): median "
                     f"{statistics.median(gaps):.2f}, tenth percentile {gaps[len(gaps) // 10]:.2f}, "
                     f"ninetieth {gaps[9 * len(gaps) // 10]:.2f} ({len(gaps)} blocks after the first {sms})")
    for k in range(0, len(order), sms):
        spans = [span[b] for b in order[k:k + sms]]
        lines.append(f"  round {k // sms} (blocks {k}-{k + len(spans) - 1} in starting order): span "
                     f"median {statistics.median(spans):.1f} us, slowest {max(spans):.1f}")
    return lines


def summary(path, sms=132):
    with open(path) as file:
        title = file.readline().lstrip("# ").strip()
        rows = list(csv.DictReader(line for line in file if not line.startswith("#")))
    start = {int(r["block"]): int(r["start_ns"]) / 1e3 for r in rows}
    end = {int(r["block"]): int(r["end_ns"]) / 1e3 for r in rows}
    consumers = {int(r["block"]): int(r["consumers_end_ns"]) / 1e3 for r in rows}
    writer = {int(r["block"]): int(r["writer_end_ns"]) / 1e3 for r in rows if int(r["writer_end_ns"]) >= 0}
    span = {b: end[b] - start[b] for b in start}
    median = statistics.median(span.values())
    bins = collections.Counter(int(s // 10) * 10 for s in span.values())
    lines = [f"== {title}",
             f"{len(rows)} blocks; the grid: {max(end.values()) - min(start.values()):.1f} us from the "
             f"first stamp to the last",
             f"block spans (us): median {median:.1f}, fastest {min(span.values()):.1f}, slowest "
             f"{max(span.values()):.1f}; per 10 us bin: " +
             ", ".join(f"{b}-{b + 10}: {n}" for b, n in sorted(bins.items()))]
    if writer:
        tails = [writer[b] - consumers[b] for b in writer]
        lines.append(f"consumer 0's dQ writer ends {statistics.median(tails):.2f} us after the block's "
                     f"consumers at the median, {max(tails):.2f} at most")
    lines += rounds(start, end, span, sms)
    slow = sorted((b for b in span if span[b] > 1.5 * median), key=lambda b: start[b])
    if slow:
        lines.append(f"{len(slow)} blocks over 1.5 x the median span (block: start us, span us): " +
                     ", ".join(f"{b}: {start[b]:.0f}, {span[b]:.0f}" for b in slow))
    if any(r["overflow"] != "0" for r in rows):
        lines.append("(some block ran out of stamp slots: its end is the last stamp it kept)")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+")
    parser.add_argument("--sms", type=int, default=132,
                        help="blocks that run at once (one per SM; 132 on the H100 SXM)")
    args = parser.parse_args()
    print("\n\n".join(summary(path, args.sms) for path in args.csv))


if __name__ == "__main__":
    main()
