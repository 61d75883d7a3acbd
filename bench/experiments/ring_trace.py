#!/usr/bin/env python3
"""Sums a CSV of ring_trace (stage 13's ring under CUPTI's activity trace) per call and GPU:

    python3 bench/experiments/ring_trace.py TRACE.csv [TRACE.csv ...]

For each file, the mean over its timed calls of: the call's time as the host saw it; per GPU,
the time of each kind of work on the compute stream (stage 11's attention kernels, the ring's
merges, copies of rows, additions, conversions, other), the compute stream's idle time inside
the call (the call's time less the union of its work), the time before its first kernel and
after its last; NCCL's kernels (on the NCCL stream) and how much of them ran under attention
kernels. The compute stream is the one that ran attention kernels; NCCL's, the one that ran
kernels named nccl*.
"""

import csv
import statistics
import sys

KINDS = [("attention", ("flash",)), ("merge", ("merge",)), ("gather", ("gather_rows",)),
         ("add", ("add_rows",)), ("convert", ("to_bf16",))]


def kind_of(name):
    lowered = name.lower()
    if "nccl" in lowered:
        return "nccl"
    for kind, words in KINDS:
        if any(word in lowered for word in words):
            return kind
    return "other"


def union(intervals):
    total, end = 0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def overlap(a, b):
    """Time of intervals a that lies under the union of intervals b."""
    merged = []
    for start, stop in sorted(b):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    total = 0
    for start, stop in a:
        for m_start, m_stop in merged:
            total += max(0, min(stop, m_stop) - max(start, m_start))
    return total


def summarize(path):
    rows = list(csv.DictReader(open(path)))
    calls = {int(r["call"]): (int(r["start_ns"]), int(r["end_ns"])) for r in rows if r["kind"] == "host_call"}
    api = [r for r in rows if r["kind"] in ("runtime", "driver") and int(r["call"]) >= 0]
    work = [r for r in rows if r["kind"] not in ("host_call", "runtime", "driver") and int(r["call"]) >= 0]
    devices = sorted({int(r["device"]) for r in work})
    lines = [f"== {path}: {len(calls)} calls, {len(work)} records on GPUs {devices}"]
    host_ms = [(end - start) / 1e6 for start, end in calls.values()]
    lines.append(f"host: call {statistics.mean(host_ms):.3f} ms (calls: {', '.join(f'{x:.3f}' for x in host_ms)})")
    header = (f"{'GPU':>3} {'attention':>9} {'merge':>7} {'gather':>7} {'add':>7} {'convert':>7} {'other':>7} "
              f"{'idle':>7} {'head':>7} {'tail':>7} {'nccl':>7} {'nccl~att':>8} {'att.kernels':>11}")
    lines += ["per GPU, mean per call, ms (compute stream: the kinds, idle inside the call, head before its",
              "first kernel, tail after its last; nccl: NCCL's kernels, nccl~att: the part under attention)",
              header]
    for device in devices:
        sums = {k: [] for k in ("attention", "merge", "gather", "add", "convert", "other", "idle", "head", "tail",
                                "nccl", "under", "count")}
        for call, (start, end) in sorted(calls.items()):
            mine = [r for r in work if int(r["device"]) == device and int(r["call"]) == call]
            attention = [r for r in mine if kind_of(r["name"]) == "attention"]
            if not attention:
                continue
            compute_stream = statistics.mode(r["stream"] for r in attention)
            compute = [r for r in mine if r["stream"] == compute_stream]
            nccl = [(int(r["start_ns"]), int(r["end_ns"])) for r in mine if kind_of(r["name"]) == "nccl"]
            by_kind = {k: 0 for k in ("attention", "merge", "gather", "add", "convert", "other")}
            for r in compute:
                kind = kind_of(r["name"])
                by_kind["other" if kind == "nccl" else kind] += int(r["end_ns"]) - int(r["start_ns"])
            intervals = [(max(start, int(r["start_ns"])), min(end, int(r["end_ns"]))) for r in compute]
            intervals = [(a, b) for a, b in intervals if b > a]
            for kind, value in by_kind.items():
                sums[kind].append(value / 1e6)
            sums["idle"].append((end - start - union(intervals)) / 1e6)
            sums["head"].append((min(a for a, _ in intervals) - start) / 1e6)
            sums["tail"].append((end - max(b for _, b in intervals)) / 1e6)
            sums["nccl"].append(sum(b - a for a, b in nccl) / 1e6)
            sums["under"].append(overlap(nccl, [(int(r["start_ns"]), int(r["end_ns"])) for r in attention]) / 1e6)
            sums["count"].append(len(attention))
        mean = {k: statistics.mean(v) if v else 0.0 for k, v in sums.items()}
        lines.append(f"{device:>3} {mean['attention']:>9.3f} {mean['merge']:>7.3f} {mean['gather']:>7.3f} "
                     f"{mean['add']:>7.3f} {mean['convert']:>7.3f} {mean['other']:>7.3f} {mean['idle']:>7.3f} "
                     f"{mean['head']:>7.3f} {mean['tail']:>7.3f} {mean['nccl']:>7.3f} {mean['under']:>8.3f} "
                     f"{mean['count']:>11.0f}")
    slow = {}
    for r in api:
        slow.setdefault((r["kind"], r["name"]), []).append((int(r["end_ns"]) - int(r["start_ns"])) / 1e6)
    lines.append("host API calls, all threads (the GPUs' workers run in parallel), per call: count, total ms, "
                 "longest ms (the 12 largest totals)")
    for (kind, name), times in sorted(slow.items(), key=lambda item: -sum(item[1]))[:12]:
        lines.append(f"  {len(times) / max(1, len(calls)):>7.1f} {sum(times) / max(1, len(calls)):>9.3f} "
                     f"{max(times):>9.3f}  {kind:<8} {name}")
    if api:  # the last call, thread by thread: where each worker's time went between API calls
        last = max(calls)
        start = calls[last][0]
        lines.append(f"call {last}, each host thread's API calls (offset from the call's start, duration, ms):")
        for thread in sorted({r["stream"] for r in api if int(r["call"]) == last}):
            mine = sorted((r for r in api if int(r["call"]) == last and r["stream"] == thread),
                          key=lambda r: int(r["start_ns"]))
            runs = []  # consecutive calls of one function as one entry: polling is hundreds
            for r in mine:
                name = r["name"].split("_v")[0]
                begin, end = (int(r["start_ns"]) - start) / 1e6, (int(r["end_ns"]) - start) / 1e6
                if runs and runs[-1][0] == name:
                    runs[-1][2], runs[-1][3] = end, runs[-1][3] + 1
                else:
                    runs.append([name, begin, end, 1])
            lines.append(f"  thread {thread}: " + "; ".join(
                f"{begin:.3f} {name}" + (f" x{count} to {end:.3f}" if count > 1 else f" {end - begin:.3f}")
                for name, begin, end, count in runs))
    names = {}
    for r in work:
        key = (kind_of(r["name"]), r["name"][:90])
        names.setdefault(key, []).append((int(r["end_ns"]) - int(r["start_ns"])) / 1e6)
    lines.append("kernels (all GPUs and calls): count, total ms, kind, name")
    for (kind, name), times in sorted(names.items(), key=lambda item: -sum(item[1])):
        lines.append(f"  {len(times):>5} {sum(times):>10.3f}  {kind:<9} {name}")
    return "\n".join(lines)


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    print("\n\n".join(summarize(path) for path in sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
