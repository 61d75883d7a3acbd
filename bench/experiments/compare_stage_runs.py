#!/usr/bin/env python3
"""One stage's forward in two committed benchmark runs: its median time in the first over the
second (> 1: faster in the second), raw and normalised by cuDNN's ratio between the same two
runs, which takes out what moved the whole run. Used for stage 10 before and after a change
that ran in different runs (lab notes 10).

usage: compare_stage_runs.py FIRST.csv SECOND.csv [--stage 10_pingpong] [--baseline torch_cudnn]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tables import medians_by_shape  # noqa: E402  (the one reader of a results CSV)


def forward_medians(path):
    """{(implementation, "BxHxLqxLkxDxcausal"): median ms} of the BF16 forward rows."""
    return {(implementation, "x".join(map(str, shape))): median
            for shape, times in medians_by_shape(path).items() for implementation, median in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--stage", default="10_pingpong")
    parser.add_argument("--baseline", default="torch_cudnn")
    arguments = parser.parse_args()
    first, second = forward_medians(arguments.first), forward_medians(arguments.second)
    rows = []
    for (stage, shape), ms in second.items():
        base = (arguments.baseline, shape)
        if stage == arguments.stage and (stage, shape) in first and base in first and base in second:
            raw = first[(stage, shape)] / ms
            rows.append((raw / (first[base] / second[base]), raw, shape))
    print(f"{arguments.stage} forward, first / second median time (> 1: faster in the second); "
          f"normalised: divided by {arguments.baseline}'s first / second")
    print(f"{'shape (BxHxLqxLkxDxcausal)':28s} normalised    raw")
    for normalised, raw, shape in sorted(rows):
        print(f"{shape:28s} {normalised:10.3f} {raw:6.3f}")


if __name__ == "__main__":
    main()
