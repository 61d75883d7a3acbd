#!/usr/bin/env python3
"""The last round of a persistent grid: for each shape, how many work tiles stage 12 makes, how
many rounds of one tile per SM they take, and how full the last round is. With work tiles of
equal length (non-causal), a grid of S SMs needs ceil(T / S) rounds for T tiles, where perfect
balance would need T / S: the ratio is the share of the time the tensor cores can be busy at
best, whatever happens inside a tile. Beside it, stage 12's measured speed against cuDNN in a
run (a results CSV), and what that ratio would be with the last round balanced (measured / the
ratio), a bound that ignores what balancing would cost. Causal shapes take their work tiles
longest first from a counter and are left out: their last round is made of the shortest tiles.

With --split, the plan of branch split-tail (12_persistent/split_plan.h, its constants read
from the header): the last round's r work tiles cut into g parts along K/V, and what the model
in the header predicts: the time in K/V tiles per SM before (ceil(T / S) n) and after
(F / S n + the split last round, its costs included), the busy share after, and the ratio to
the baseline if the stage's time shrank by exactly that (a model, not a measurement).

With --pass bwd, the same count for stage 11's backward: one block per SM, a block per
BLOCK_KV = 128 keys of a head at both head dims (its work tiles), against the baseline's backward.

usage: last_round.py RUN.csv [--stage 12_persistent] [--sms 132] [--split] [--pass fwd|bwd]
"""
import argparse
import math
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tables import medians_by_shape  # noqa: E402  (the one reader of a results CSV)

BLOCK_Q = {64: 192, 128: 128}  # stage 12's query rows per work tile (3 consumers at D = 64, 2 at 128)
BLOCK_KV = {64: 128, 128: 176}  # its keys per K/V tile, non-causal
BACKWARD_BLOCK_KV = 128  # stage 11's keys per backward block (BackwardTiling::BLOCK_KV), both head dims
SPLIT_PLAN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "12_persistent", "split_plan.h")


def split_constants():
    """The cost model's constants as split_plan.h defines them."""
    text = open(SPLIT_PLAN).read()
    return {name: int(re.search(rf"constexpr int {name} = (\d+);", text).group(1))
            for name in ("SPLIT_COST_KV_TILES", "PART_COST_KV_TILES", "SPLIT_MARGIN_PERCENT",
                         "SPLIT_MIN_GAIN_PERMILLE")}


def last_round_kv_tiles(r, g, sms, n, c):
    return math.ceil(r * g / sms) * (math.ceil(n / g) + (c["PART_COST_KV_TILES"] if g > 1 else 0))


def plan_split(tiles, sms, n, c):
    """split_plan.h's plan_split: (whole, split tiles, parts)."""
    r = tiles % sms if tiles >= sms else tiles
    if r == 0:
        return tiles, 0, 1
    best_parts, best_time = 1, n
    for g in range(2, n // 2 + 1):
        time = last_round_kv_tiles(r, g, sms, n, c) + c["SPLIT_COST_KV_TILES"]
        if time < best_time:
            best_parts, best_time = g, time
    rounds = math.ceil(tiles / sms)
    if (best_parts == 1 or best_time * 100 > (100 - c["SPLIT_MARGIN_PERCENT"]) * n
            or (n - best_time) * 1000 < c["SPLIT_MIN_GAIN_PERMILLE"] * rounds * n):
        return tiles, 0, 1
    return tiles - r, r, best_parts


def non_causal_rows(arguments):
    """(shape, work tiles, baseline time over the stage's) of every non-causal shape of the run
    where both ran, in the tables' order."""
    medians = medians_by_shape(arguments.run, arguments.pass_name)
    for shape in sorted(medians, key=lambda s: (s[4], s[2], s[0], s[1], s[3])):
        batch, heads, len_q, len_kv, head_dim, causal = shape
        times = medians[shape]
        if causal or arguments.stage not in times or arguments.baseline not in times:
            continue
        if arguments.pass_name == "bwd":
            tiles = batch * heads * math.ceil(len_kv / BACKWARD_BLOCK_KV)
        else:
            tiles = batch * heads * math.ceil(len_q / BLOCK_Q[head_dim])
        yield shape, tiles, times[arguments.baseline] / times[arguments.stage]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run")
    parser.add_argument("--stage", default="12_persistent")
    parser.add_argument("--baseline", default="torch_cudnn")
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--split", action="store_true", help="the split-tail plan and its predicted gain")
    parser.add_argument("--pass", dest="pass_name", choices=("fwd", "bwd"), default="fwd",
                        help="bwd: stage 11's backward blocks (give --stage 11_hopper_backward)")
    arguments = parser.parse_args()
    if arguments.split and arguments.pass_name == "bwd":
        parser.error("--split models the forward's plan only")
    if arguments.split:
        return split_table(arguments)
    passes = "" if arguments.pass_name == "fwd" else ", backward"
    print(f"# {arguments.run}: non-causal shapes, {arguments.sms} SMs{passes}; "
          f"ratio = {arguments.baseline} time over {arguments.stage}'s")
    print(f"{'shape':<26}{'work tiles':>11}{'rounds':>9}{'full rounds':>12}{'busy at best':>13}"
          f"{'measured':>10}{'balanced':>10}")
    for shape, tiles, measured in non_causal_rows(arguments):
        rounds = tiles / arguments.sms
        busy = rounds / math.ceil(rounds)
        print(f"{'x'.join(map(str, shape)):<26}{tiles:>11}{rounds:>9.2f}{math.ceil(rounds):>12}{busy:>13.3f}"
              f"{measured:>10.3f}{measured / busy:>10.3f}")
    return 0


def split_table(arguments):
    c = split_constants()
    print(f"# {arguments.run}: non-causal shapes, {arguments.sms} SMs; split plan of 12_persistent/split_plan.h "
          f"({', '.join(f'{k} {v}' for k, v in c.items())}); times in K/V tiles per SM, a model")
    print(f"# ratio = {arguments.baseline} time over {arguments.stage}'s; 'predicted' = measured x before / after")
    print(f"{'shape':<26}{'tiles':>7}{'n':>5}{'r':>5}{'g':>4}{'parts':>7}{'before':>8}{'after':>8}"
          f"{'busy before':>12}{'busy after':>11}{'gain':>7}{'measured':>10}{'predicted':>10}")
    for shape, tiles, measured in non_causal_rows(arguments):
        len_kv, head_dim = shape[3], shape[4]
        n = math.ceil(len_kv / BLOCK_KV[head_dim])
        # The kernel splits at D = 64 only (12_persistent/attention.cu, `splits`).
        whole, r, g = plan_split(tiles, arguments.sms, n, c) if head_dim == 64 else (tiles, 0, 1)
        ideal = tiles / arguments.sms * n
        before = math.ceil(tiles / arguments.sms) * n
        if g > 1:
            after = whole // arguments.sms * n + last_round_kv_tiles(r, g, arguments.sms, n, c) + c["SPLIT_COST_KV_TILES"]
        else:
            after = before
        print(f"{'x'.join(map(str, shape)):<26}{tiles:>7}{n:>5}{r:>5}{g:>4}{r * g:>7}{before:>8}{after:>8}"
              f"{ideal / before:>12.3f}{ideal / after:>11.3f}{before / after:>7.3f}{measured:>10.3f}"
              f"{measured * before / after:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
