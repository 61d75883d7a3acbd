#!/usr/bin/env python3
"""What one consumer thread of stage 10's D = 64 forward issues per K/V tile, read from the SASS,
and what that means per SM sub-partition: the cycles of the exponent unit (MUFU), of issue and of
the tensor cores per tile (lab notes 10, "Exponentials on the FMA pipe at D = 64").

The main loop is the backward branch with the most instructions; a tile that needs no mask takes
the path from the loop's top to the first forward branch after `wgmma.wait_group 1` (the branch
over the mask code), then from that branch's target to the loop's end. Every instruction on that
path runs once per tile and thread.

Per sub-partition and tile (Tiling<64, 3, 128, 2>): one warp of each of the 3 consumer warpgroups
(the producer's one working thread adds a few dozen instructions on one of the four);
  issue   = 3 x instructions per thread   (one instruction per clock per sub-partition)
  MUFU    = 3 x 8 x MUFU.EX2 per thread    (16 results per clock per SM: a warp's takes 8 clocks)
  tensor  = 2 x 192 x 128 x 64 x 2 FLOP / 4 sub-partitions / 1024 FLOP per clock = 1,536
            (dense BF16 at the H100's datasheet rate, 4096 FLOP per clock per SM)
and one consumer warp's softmax alone (after wait_group 0): MUFU 8 x MUFU.EX2 against its
instructions there.

usage: sass_tile_counts.py LABEL=SASS [LABEL=SASS ...]   (cuobjdump -sass of an object or library)
"""
import collections
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))
from check_sass import BRANCH, functions  # noqa: E402

TARGET = re.compile(r"\bBRA(?:\.\w+)*\s+(?:!?U?P\w+,\s*)?`?\(?0x([0-9a-f]+)")
TENSOR_CYCLES = 2 * 192 * 128 * 64 * 2 // 4 // 1024
SHOWN = ["MUFU.EX2", "FFMA", "FADD", "FMUL", "FMNMX", "IMAD", "F2FP", "FSEL", "HGMMA", "uniform"]


def opcode(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def group(op):
    if op.startswith(("U", "R2UR", "S2UR")):
        return "uniform"
    for name in SHOWN:
        if op == name or op.startswith(name + "."):
            return name
    return "other"


def tile_path(code):
    """The instructions of an unmasked tile, the loop's bounds and the skipped range."""
    last_exit = max(a for a, t in code if re.search(r"(^|\s)EXIT\b", t))
    loop = None
    for address, text in code:
        branch = BRANCH.match(text)
        if branch and int(branch.group(1), 16) < address < last_exit:
            start = int(branch.group(1), 16)
            size = sum(1 for a, _ in code if start <= a <= address)
            if loop is None or size > loop[2]:
                loop = (start, address, size)
    start, end, _ = loop
    body = [(a, t) for a, t in code if start <= a <= end]
    wait_one = next(a for a, t in body if t == "WARPGROUP.DEPBAR.LE gsb0, 0x1")
    skip_from, skip_to = next((a, int(TARGET.search(t).group(1), 16)) for a, t in body
                              if a > wait_one and TARGET.search(t)
                              and int(TARGET.search(t).group(1), 16) > a)
    path = [(a, t) for a, t in body if a <= skip_from or a >= skip_to]
    return path, (start, end, skip_from, skip_to)


def main():
    rows = []
    for argument in sys.argv[1:]:
        label, path = argument.split("=", 1)
        kernels = functions(open(path).read())
        name = next(n for n in kernels if "TilingILi64E" in n)
        tile, (start, end, skip_from, skip_to) = tile_path(kernels[name])
        groups = collections.Counter(group(opcode(t)) for _, t in tile)
        wait_zero = next(a for a, t in tile if t == "WARPGROUP.DEPBAR.LE gsb0, 0x0")
        softmax = [(a, t) for a, t in tile if a > wait_zero]
        rows.append((label, len(kernels[name]), len(tile), groups, len(softmax),
                     sum(opcode(t) == "MUFU.EX2" for _, t in softmax)))
        print(f"{label}: {path}: kernel {len(kernels[name])} instructions; main loop "
              f"{start:#x}-{end:#x}, the mask code {skip_from + 16:#x}-{skip_to - 16:#x} skipped")
    print()
    print("per consumer thread and unmasked tile:")
    print(f"{'k':>6} {'all':>5} " + " ".join(f"{name:>8}" for name in SHOWN + ["other"]))
    for label, _, total, groups, _, _ in rows:
        print(f"{label:>6} {total:>5} " + " ".join(f"{groups[name]:>8}" for name in SHOWN + ["other"]))
    print()
    print(f"per SM sub-partition and tile, cycles (tensor: {TENSOR_CYCLES} at the datasheet rate; bound: the "
          f"largest of issue, MUFU and tensor, the fewest cycles a tile can take):")
    print(f"{'k':>6} {'issue':>6} {'MUFU':>6} {'bound':>6} {'bound/k=0':>10}   "
          f"one warp's softmax alone: {'MUFU':>5} {'issue':>5}")
    base = None
    for label, _, total, groups, softmax, softmax_mufu in rows:
        issue, mufu = 3 * total, 3 * 8 * groups["MUFU.EX2"]
        bound = max(issue, mufu, TENSOR_CYCLES)
        base = base or bound
        print(f"{label:>6} {issue:>6} {mufu:>6} {bound:>6} {bound / base:>10.3f}   "
              f"{'':>25} {8 * softmax_mufu:>5} {softmax:>5}")


if __name__ == "__main__":
    sys.exit(main())
