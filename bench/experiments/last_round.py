#!/usr/bin/env python3
"""The last round of a persistent grid: for each shape, how many work tiles stage 12 makes, how
many rounds of one tile per SM they take, and how full the last round is. With work tiles of
equal length (non-causal), a grid of S SMs needs ceil(T / S) rounds for T tiles, where perfect
balance would need T / S: the ratio is the share of the time the tensor cores can be busy at
best, whatever happens inside a tile. Beside it, stage 12's measured speed against cuDNN in a
run (a results CSV), and what that ratio would be with the last round balanced (measured / the
ratio), a bound that ignores what balancing would cost. Causal shapes take their work tiles
longest first from a counter and are left out: their last round is made of the shortest tiles.

usage: last_round.py RUN.csv [--stage 12_persistent] [--sms 132]
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tables import medians_by_shape  # noqa: E402  (the one reader of a results CSV)

BLOCK_Q = {64: 192, 128: 128}  # stage 12's query rows per work tile (3 consumers at D = 64, 2 at 128)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run")
    parser.add_argument("--stage", default="12_persistent")
    parser.add_argument("--baseline", default="torch_cudnn")
    parser.add_argument("--sms", type=int, default=132)
    arguments = parser.parse_args()
    medians = medians_by_shape(arguments.run)
    print(f"# {arguments.run}: non-causal shapes, {arguments.sms} SMs; ratio = {arguments.baseline} time over {arguments.stage}'s")
    print(f"{'shape':<26}{'work tiles':>11}{'rounds':>9}{'full rounds':>12}{'busy at best':>13}"
          f"{'measured':>10}{'balanced':>10}")
    for shape in sorted(medians, key=lambda s: (s[4], s[2], s[0], s[1], s[3])):
        batch, heads, len_q, len_kv, head_dim, causal = shape
        times = medians[shape]
        if causal or arguments.stage not in times or arguments.baseline not in times:
            continue
        tiles = batch * heads * math.ceil(len_q / BLOCK_Q[head_dim])
        rounds = tiles / arguments.sms
        busy = rounds / math.ceil(rounds)
        measured = times[arguments.baseline] / times[arguments.stage]
        print(f"{'x'.join(map(str, shape)):<26}{tiles:>11}{rounds:>9.2f}{math.ceil(rounds):>12}{busy:>13.3f}"
              f"{measured:>10.3f}{measured / busy:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
