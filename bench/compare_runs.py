#!/usr/bin/env python3
"""Do two benchmark runs tell the same story? Compares the ratios the course prints, every BF16
stage against cuDNN and against FlashAttention-2 (torch_cudnn, torch_flash), forward and
backward, at every shape both runs timed, and prints how far the second run's ratio is from the
first's. The course's target: within 3% at every shape the README and the chapters quote, for
two runs back to back on one machine. The quoted shapes are read from the pages' generated
numbers and tables (bench/tables.py's markers): a value marker quotes its shape and pass, a
sweep table the shapes and pass it shows, a stage's table both headlines. Each run's system.txt
(beside its results.csv) names the GPU by its UUID; the report says whether both runs timed
the same one.

usage: compare_runs.py FIRST SECOND [--tolerance 0.03] [--out FILE]
  FIRST, SECOND: a results.csv or a folder holding one (bench/results/<gpu>/...).
Every ratio is listed, beyond the tolerance or not. Exit status 0 when every ratio at a quoted
(shape, pass) agrees within the tolerance, 1 otherwise, and 1 when the two runs' system.txt
name different GPUs (two GPUs are not one machine's runs back to back).
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from schema import RATIO_BASELINES, STAGES  # noqa: E402
from tables import markdown_files, quoted_shapes, read_results, read_sweeps  # noqa: E402

BASELINES = RATIO_BASELINES


def results_path(path):
    return os.path.join(path, "results.csv") if os.path.isdir(path) else path


def gpu_uuids(path):
    """The GPU UUIDs in the nvidia-smi table of the run's system.txt; None where there is none
    (a run from before system.txt recorded them, or a bare CSV)."""
    folder = os.path.dirname(results_path(path)) or "."
    try:
        with open(os.path.join(folder, "system.txt")) as system:
            lines = system.read().splitlines()
    except OSError:
        return None
    header = next((i for i, line in enumerate(lines) if line.strip().startswith("index,")), None)
    if header is None:
        return None
    columns = [c.strip() for c in lines[header].split(",")]
    if "uuid" not in columns:
        return None
    uuids = []
    for line in lines[header + 1:]:
        if not line.startswith("  ") or line.strip().count(",") != len(columns) - 1:
            break
        uuids.append(line.split(",")[columns.index("uuid")].strip())
    return uuids or None


def different_gpus(first, second):
    a, b = gpu_uuids(first), gpu_uuids(second)
    return a is not None and b is not None and a != b


def same_gpu_line(first, second):
    a, b = gpu_uuids(first), gpu_uuids(second)
    if a is None or b is None:
        return "GPU: not recorded by both runs (system.txt without a uuid column)"
    if a == b:
        return "GPU: the same in both runs (" + ", ".join(a) + ")"
    return "GPU: DIFFERENT (first " + ", ".join(a) + "; second " + ", ".join(b) + ")"


def quoted_in_the_course():
    pages = []
    for path in markdown_files():
        with open(path) as page:
            pages.append(page.read())
    return quoted_shapes(pages, read_sweeps())


def ratios(rows):
    """{(stage, baseline, shape, pass): baseline time / stage time} over the BF16 rows."""
    times = {(stage, shape, pass_name): float(row["median_ms"])
             for (stage, dtype, shape, pass_name), row in rows.items()
             if dtype == "bf16" and row["status"] == "ok"}
    found = {}
    for (stage, shape, pass_name), stage_ms in times.items():
        if stage not in STAGES:
            continue
        for baseline in BASELINES:
            baseline_ms = times.get((baseline, shape, pass_name))
            if baseline_ms:
                found[(stage, baseline, shape, pass_name)] = baseline_ms / stage_ms
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--tolerance", type=float, default=0.03)
    parser.add_argument("--out", help="also write the report here")
    arguments = parser.parse_args()
    first = ratios(read_results(results_path(arguments.first)))
    second = ratios(read_results(results_path(arguments.second)))
    common = sorted(set(first) & set(second))
    if not common:
        raise SystemExit("compare_runs.py: no stage/baseline ratio in both runs")
    changes = {k: second[k] / first[k] - 1 for k in common}
    outside = [k for k in common if abs(changes[k]) > arguments.tolerance]
    on_the_pages = quoted_in_the_course()
    quoted_keys = [k for k in common if (k[2], k[3]) in on_the_pages]
    quoted_outside = [k for k in outside if k in quoted_keys]
    lines = [f"first:  {results_path(arguments.first)}",
             f"second: {results_path(arguments.second)}",
             same_gpu_line(arguments.first, arguments.second),
             f"{len(common)} ratios (BF16 stage vs {' and '.join(BASELINES)}, per shape and pass) "
             f"in both runs; second / first - 1: median {statistics.median(changes.values()):+.2%}"
             f", largest {max(changes.values(), key=abs):+.2%}; "
             f"{len(outside)} beyond {arguments.tolerance:.0%}",
             f"quoted by the README and the chapters: {len(quoted_keys)} of these ratios "
             f"({len(on_the_pages)} shapes and passes); {len(quoted_outside)} beyond "
             f"{arguments.tolerance:.0%}: " +
             ("the runs AGREE" if not quoted_outside else "the runs DISAGREE")]
    by_stage = {}
    for k in common:
        by_stage.setdefault((k[0], k[1], k[3]), []).append(abs(changes[k]))
    lines.append("largest |change| per stage, baseline and pass:")
    for (stage, baseline, pass_name), values in sorted(by_stage.items()):
        lines.append(f"  {stage:20s} / {baseline:12s} {pass_name}: {max(values):.2%} "
                     f"over {len(values)} shapes")
    lines.append("every ratio (baseline time / stage time), first -> second:")
    for k in common:
        stage, baseline, shape, pass_name = k
        tag = "x".join(map(str, shape))
        mark = ("  <-- beyond, quoted" if k in quoted_outside else
                "  <-- beyond (not quoted)" if k in outside else "")
        lines.append(f"  {stage:20s} {baseline:12s} {pass_name} {tag:24s} {first[k]:.3f} -> "
                     f"{second[k]:.3f} ({changes[k]:+.2%}){mark}")
    text = "\n".join(lines)
    print(text)
    if arguments.out:
        with open(arguments.out, "w") as out:
            out.write(text + "\n")
    return 1 if quoted_outside or different_gpus(arguments.first, arguments.second) else 0


if __name__ == "__main__":
    sys.exit(main())
