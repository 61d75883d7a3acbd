#!/usr/bin/env python3
"""Forward ratios from the progress lines a benchmark run prints (bench/driver.py's
"[step/steps, t min] fwd B=.. H=.. ...: impl/dtype median; ..." lines, four significant digits),
for runs whose CSV did not come back: a run cut short, or one whose results folder was not the
one copied. Per BF16 forward shape, the median time of each reference over the stage's (> 1: the
stage is faster), one column per log. Used for the element-type groups of bench/driver.py
(docs/benchmarking.md, "One element type per group").

usage: progress_ratios.py LOG [LOG ...] [--stage 12_persistent] [--against torch_cudnn]
"""
import argparse
import re

PROGRESS = re.compile(r"\[\d+/\d+, [\d.]+ min\] (fwd|bwd) B=(\d+) H=(\d+) Lq=(\d+) Lk=(\d+) "
                      r"D=(\d+) causal=(\d): (.*)")


def forward_medians(path):
    """{"BxHxLqxLkxDxcausal": {"impl/dtype": median ms}} of a log's forward progress lines."""
    shapes = {}
    with open(path) as log:
        for line in log:
            match = PROGRESS.match(line)
            if not match or match.group(1) != "fwd":
                continue
            times = {}
            for item in re.sub(r" \(\d+ skipped\)$", "", match.group(8).strip()).split("; "):
                name, median = item.rsplit(" ", 1)
                times[name] = float(median)
            shapes["x".join(match.groups()[1:7])] = times
    return shapes


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+")
    parser.add_argument("--stage", default="12_persistent")
    parser.add_argument("--against", default="torch_cudnn")
    arguments = parser.parse_args()
    runs = [forward_medians(path) for path in arguments.logs]
    stage, reference = arguments.stage + "/bf16", arguments.against + "/bf16"
    shapes = [shape for shape in runs[0] if stage in runs[0][shape]]
    print(f"# {arguments.against}'s forward time over {arguments.stage}'s (> 1: the stage is "
          f"faster); columns: {', '.join(arguments.logs)}")
    for shape in shapes:
        cells = []
        for run in runs:
            times = run.get(shape, {})
            cells.append(f"{times[reference] / times[stage]:8.3f}"
                         if stage in times and reference in times else f"{'-':>8}")
        print(f"{shape:<26}" + "".join(cells))


if __name__ == "__main__":
    main()
