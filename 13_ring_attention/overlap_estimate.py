#!/usr/bin/env python3
"""What to expect of the ring's overlap, before any multi-GPU run: per ring step, stage 11's
compute time (from a committed single-GPU results CSV) against the time NVLink needs to pass the
step's key/value block (and, backward, its dK, dV sums) to the next GPU.

Every step of the ring computes the local queries against one block of as many keys, so with
L = N / P tokens per GPU a step is stage 11's forward (or backward) at L x L; zigzag's causal
steps are two unmasked (L/2) x (L/2) calls, half the work. The transfer of a step moves K and
V of the block, 2 x B H L D bf16 values (4 bytes per token per head dimension); the backward
also moves the FP32 dK and dV sums (8 more). Hidden when compute >= transfer. Compute grows
like L^2 and the transfer like L, so the ratio grows like L, and each row gives the shortest L
per GPU above which the transfer fits under the compute (L_min), at that row's throughput.

The link: NVLink 4 of the H100 SXM, 450 GB/s each way per GPU by NVIDIA's datasheet (900 GB/s
both ways; the bandwidth a ring uses, since every GPU sends and receives at once). NCCL's
send/recv reaches less than that; a measured figure replaces it once the device run has one
(lab notes 13). A second column at 300 GB/s shows the margin.

usage: overlap_estimate.py [--results CSV] [--check]   (writes or checks overlap-estimate.txt)
"""
import argparse
import csv
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "13_ring_attention", "overlap-estimate.txt")
DEFAULT_CSV = os.path.join("bench", "results", "nvidia-h100-80gb-hbm3", "results.csv")
LINKS_GBPS = [450.0, 300.0]
STAGE = "11_hopper_backward"


def stage11_ms(rows, batch, heads, length, head_dim, causal, pass_):
    for row in rows:
        if (row["stage"] == STAGE and int(row["batch"]) == batch and int(row["heads"]) == heads and
                int(row["len_q"]) == length and int(row["len_kv"]) == length and
                int(row["head_dim"]) == head_dim and int(row["causal"]) == causal and
                row["pass"] == pass_ and row["status"] == "ok"):
            return float(row["median_ms"])
    raise SystemExit(f"{STAGE} {batch}x{heads}x{length}x{length}x{head_dim}x{causal} {pass_}: "
                     "no row in the results CSV")


def report(csv_path):
    with open(os.path.join(ROOT, csv_path)) as handle:
        rows = list(csv.DictReader(handle))
    lines = [f"Ring step: stage 11's time (from {csv_path}) against the transfer of the step's",
             "block over NVLink; ratio = compute / transfer (>= 1: the transfer can hide).",
             "L: tokens per GPU. Causal steps are zigzag's: two unmasked (L/2) x (L/2) calls.",
             ""]
    header = (f"{'shape per step':<28}{'pass':<6}{'compute ms':>11}{'MB moved':>10}" +
              "".join(f"{f'ms @{int(b)}':>10}{'ratio':>7}" for b in LINKS_GBPS) + f"{'L_min @450':>12}")
    lines.append(header)
    lines.append("-" * len(header))
    for batch, heads, head_dim in [(1, 32, 128), (4, 8, 64)]:
        for length in [4096, 8192, 16384]:
            for causal in [0, 1]:
                for pass_ in ["fwd", "bwd"]:
                    if causal:
                        compute = 2 * stage11_ms(rows, batch, heads, length // 2, head_dim, 0, pass_)
                        pairs = 2 * (length // 2) ** 2
                    else:
                        compute = stage11_ms(rows, batch, heads, length, head_dim, 0, pass_)
                        pairs = length ** 2
                    bytes_per_token = (4 if pass_ == "fwd" else 12) * batch * heads * head_dim
                    moved = bytes_per_token * length
                    # compute grows like pairs, transfer like L: the L where they meet, at this
                    # row's throughput (time per pair) and the first link speed.
                    # compute(L) = seconds_per_pair * L^2 (L^2 / 2 causal), transfer(L) = bytes * L / BW
                    seconds_per_pair = compute * 1e-3 / pairs
                    factor = 1.0 if not causal else 0.5
                    l_min = bytes_per_token / (LINKS_GBPS[0] * 1e9) / (seconds_per_pair * factor)
                    shape = f"{batch}x{heads}x{length}x{length}x{head_dim}" + (" causal" if causal else "")
                    line = f"{shape:<28}{pass_:<6}{compute:>11.3f}{moved / 1e6:>10.1f}"
                    for link in LINKS_GBPS:
                        transfer = moved / (link * 1e9) * 1e3
                        line += f"{transfer:>10.3f}{compute / transfer:>7.1f}"
                    line += f"{l_min:>12.0f}"
                    lines.append(line)
    lines.append("")
    lines.append("One GPU at a million tokens (B = 1, H = 32, D = 128, causal), at stage 11's 16K rates:")
    heads, head_dim, tokens = 32, 128, 1 << 20
    forward_bytes = 4 * heads * head_dim * 2 + heads * 4            # Q, K, V, O bf16; LSE FP32
    backward_bytes = forward_bytes + 4 * heads * head_dim * 2 + heads * head_dim * 4 + 2 * heads * 4
    # dO, dQ, dK, dV bf16; stage 11's FP32 dQ accumulator; its delta and LSE rows
    for pass_, per_token in [("fwd", forward_bytes), ("bwd", backward_bytes)]:
        ms = stage11_ms(rows, 1, heads, 16384, head_dim, 1, pass_)
        rate = (4 * heads * 16384 ** 2 * head_dim / 2) * (1 if pass_ == "fwd" else 2.5) / (ms * 1e-3)
        flops = (4 * heads * tokens ** 2 * head_dim / 2) * (1 if pass_ == "fwd" else 2.5)
        lines.append(f"  {pass_}: {per_token:,} bytes per token, {per_token * tokens / 2**30:.0f} GiB; "
                     f"{rate / 1e12:.0f} TFLOP/s -> {flops / rate:.1f} s per call")
    lines.append("")
    lines.append("The ratio grows in proportion to L: at the issue's 64K tokens per GPU it is four")
    lines.append("times the 16K row's. Whether the transfer really hides also depends on what it")
    lines.append("takes from the compute (SMs for NCCL's kernels, memory bandwidth): the device run says.")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", default=DEFAULT_CSV)
    parser.add_argument("--check", action="store_true")
    arguments = parser.parse_args()
    text = report(arguments.results)
    if arguments.check:
        with open(OUT) as handle:
            if handle.read() != text:
                print(f"stale: {os.path.relpath(OUT, ROOT)} (run python3 13_ring_attention/overlap_estimate.py)")
                sys.exit(1)
        return
    with open(OUT, "w") as handle:
        handle.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
