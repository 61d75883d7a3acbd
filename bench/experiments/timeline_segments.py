"""Per stamped block of a persistent backward (one that walks several work tiles, each a key
block or a part of one), the work tiles one after the other as consumer 0 stamped them: when it
started the work tile, found its first query tile ready, finished its last gradients and ended
(dK and dV out), in microseconds from the grid's first stamp, and the gaps between them.

Reads the CSV of build/experiments/timeline_11_hopper_backward built from a persistent variant
with the stamp counts carried from one work tile to the next (the variant's patch in
docs/profiles/11_hopper_backward/persistent-bwd-h100/ changes common/timeline.cuh so).

    python3 bench/experiments/timeline_segments.py timeline.csv [more.csv ...]
"""

import argparse
import csv


def segments(path):
    with open(path) as file:
        title = file.readline().lstrip("# ").strip()
        rows = list(csv.DictReader(line for line in file if not line.startswith("#")))
    t0 = min(int(r["nanoseconds"]) for r in rows)
    lines = [f"== {title}",
             "per block, consumer 0's work tiles: start, first tile ready, last gradients done, end (us from the "
             "grid's first stamp); query tiles walked (the first one); then from the last gradients to the end "
             "(the epilogue) and from the end to the next work tile's first tile ready (us)"]
    for block in sorted({int(r["block"]) for r in rows}):
        stamps = sorted((int(r["nanoseconds"]) - t0, r["event"], int(r["tile"])) for r in rows
                        if int(r["block"]) == block and r["warpgroup"] == "0")
        starts = [i for i, s in enumerate(stamps) if s[1] == "start"] + [len(stamps)]
        lines.append(f"block {block}:")
        previous_end = None
        for a, b in zip(starts, starts[1:]):
            tile = stamps[a:b]
            ready = [s for s in tile if s[1] == "tile_ready"]
            done = [s for s in tile if s[1] == "gradients_done"]
            end = [s for s in tile if s[1] == "end"]
            if not ready or not done:
                continue
            start_us, ready_us, done_us = tile[0][0] / 1e3, ready[0][0] / 1e3, done[-1][0] / 1e3
            end_us = end[-1][0] / 1e3 if end else None
            gap = f"; {ready_us - previous_end:.1f} since the last end" if previous_end is not None else ""
            epilogue = f", epilogue {end_us - done_us:.1f}" if end_us is not None else ", no end stamp"
            lines.append(f"  {start_us:8.1f} {ready_us:8.1f} {done_us:8.1f} "
                         f"{end_us if end_us is None else round(end_us, 1)!s:>8}  {len(ready):2d} tiles "
                         f"(from {ready[0][2]}){epilogue}{gap}")
            previous_end = end_us
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+")
    print("\n\n".join(segments(path) for path in parser.parse_args().csv))


if __name__ == "__main__":
    main()
