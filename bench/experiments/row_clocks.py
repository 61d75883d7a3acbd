#!/usr/bin/env python3
"""The SM clock and board power a results CSV recorded for one shape's BF16 forward rows (the
medians of NVML's readings after each turn: columns sm_clock_mhz and power_w), with the row's
median time, for several runs side by side: what power state each run timed the shape in
(docs/benchmarking.md, "One element type per group").

usage: row_clocks.py RUN.csv [RUN.csv ...] --shape 1x32x4096x4096x128x0
                     [--stages 12_persistent,torch_cudnn,10_pingpong]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tables import read_results  # noqa: E402  (the one reader of a results CSV)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--shape", required=True)
    parser.add_argument("--stages", default="12_persistent,torch_cudnn,10_pingpong")
    arguments = parser.parse_args()
    stages = arguments.stages.split(",")
    shape = tuple(int(field) for field in arguments.shape.split("x"))
    print(f"# BF16 forward at {arguments.shape}: median ms, SM clock MHz, board power W")
    for path in arguments.runs:
        rows = read_results(path)
        print(path)
        for stage in stages:
            row = rows.get((stage, "bf16", shape, "fwd"))
            row = row if row and row["status"] == "ok" else None
            print(f"  {stage:<16}" + (f"{float(row['median_ms']):9.4f} ms {row['sm_clock_mhz']:>6} MHz "
                                      f"{row['power_w']:>5} W" if row else "  (no row)"))


if __name__ == "__main__":
    main()
