#!/usr/bin/env python3
"""Speed ratios between implementations timed in one run (a results CSV of make bench or of
bench/driver.py): for every BF16 forward shape, the time of each reference implementation over
the time of the stage, > 1 where the stage is faster. Used for a new stage's probe against the
stage before it and the baselines, before a committed run has its rows (lab notes 12).

usage: stage_ratios.py RUN.csv --stage 12_persistent [--against 10_pingpong,torch_cudnn,torch_flash]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tables import medians_by_shape  # noqa: E402  (the one reader of a results CSV)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run")
    parser.add_argument("--stage", required=True)
    parser.add_argument("--against", default="10_pingpong,torch_cudnn,torch_flash")
    parser.add_argument("--pass", dest="pass_name", default="fwd")
    arguments = parser.parse_args()
    against = arguments.against.split(",")
    medians = medians_by_shape(arguments.run, arguments.pass_name)
    print(f"# {arguments.run}: {arguments.pass_name} time of each implementation over {arguments.stage}'s "
          "(> 1: the stage is faster), per shape B x H x Lq x Lk x D x causal")
    print(f"{'shape':<26}" + "".join(f"{name:>14}" for name in against))
    worst = {name: None for name in against}
    for shape in sorted(medians, key=lambda s: (s[4], s[5], s[2], s[0], s[1], s[3])):
        times = medians[shape]
        if arguments.stage not in times:
            continue
        cells = []
        for name in against:
            if name in times:
                ratio = times[name] / times[arguments.stage]
                cells.append(f"{ratio:14.3f}")
                if worst[name] is None or ratio < worst[name][0]:
                    worst[name] = (ratio, "x".join(map(str, shape)))
            else:
                cells.append(f"{'-':>14}")
        print(f"{'x'.join(map(str, shape)):<26}" + "".join(cells))
    for name, value in worst.items():
        if value:
            print(f"# lowest against {name}: {value[0]:.3f} at {value[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
