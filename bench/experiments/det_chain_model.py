"""A model of stage 11's deterministic backward at the level of blocks and dQ chains, to compare
chain orders and launch arrangements before building them (lab notes 11, "block by block").

Each block claims its (head, key block) in start order and walks its query tiles (the order of
11_hopper_backward/dq_order.h, ported below); its consumers finish a tile every T us and stage
its piece of dQ once the writer has read the previous piece; the writer waits for the tile's
turn in its chain (the semaphore), then for the piece, reads it in `read` us and, in
deterministic mode, releases the turn `complete` us later. A block ends when its consumers and
its writer are done; the next claimed block starts on the freed SM `gap` us later. The first
wave's blocks all start at 0. Every parameter is a measured median of
docs/profiles/11_hopper_backward/det-timeline-h100/ (TL3, TL4) unless given.

    python3 bench/experiments/det_chain_model.py            # the headline and the measured shapes
"""

import argparse
import heapq


class Order:
    """dq_order.h's DqOrder, non-causal: walk_start, tile_at, turn, chain_of."""

    def __init__(self, kv_tiles, q_tiles, rotate, chains):
        self.kv, self.q, self.rotate, self.chains = kv_tiles, q_tiles, rotate, chains

    def tile_at(self, b, step):
        tile = (b * (self.q // self.kv) if self.rotate else 0) + step
        return tile - self.q if self.rotate and tile >= self.q else tile

    def turn(self, b, t):
        if not self.rotate:
            return b // self.chains
        s = t // (self.q // self.kv)
        first = min(s, self.kv - 1)
        r = first - b if first >= b else first - b + self.kv
        if b + r < self.kv:
            return r // self.chains
        wrapped, residue = b + r - self.kv, b % self.chains
        return (self.kv - 1 - b) // self.chains + ((wrapped - residue) // self.chains + 1 if wrapped >= residue else 0)


def simulate(heads, kv_tiles, q_tiles, resident, deterministic=True, rotate=True, chains=2, tile=2.70,
             start=2.7, first_start=8.1, end=2.6, read=0.72, complete=0.63, gap=1.0, launch_heads=None):
    """The grid's time in us and the blocks' spans. launch_heads: launches of that many whole
    heads, end to end (None: one grid)."""
    order = Order(kv_tiles, q_tiles, rotate, chains)
    total = heads * kv_tiles
    semaphore = {}   # (head, chain, tile) -> the times of its releases so far, in turn order
    waiting = {}     # (head, chain, tile, turn) -> block waiting for it
    events, seq = [], 0
    state = {}
    spans = {}

    def push(time, block):
        nonlocal seq
        heapq.heappush(events, (time, seq, block))
        seq += 1

    def begin(block, time, first_wave):
        state[block] = {"t0": time, "step": 0, "ready": time + (first_start if first_wave else start),
                        "read": None, "released": time, "need": None}
        push(time, block)

    groups = [(g, min(g + (launch_heads or heads), heads)) for g in range(0, heads, launch_heads or heads)]
    group_index, claimed, clock = 0, 0, 0.0
    limit = groups[0][1] * kv_tiles

    def start_next(time, first_wave=False):
        nonlocal claimed
        if claimed < limit:
            begin(claimed, time, first_wave)
            claimed += 1

    for _ in range(min(resident, limit)):
        start_next(0.0, True)
    finished = 0
    while events:
        time, _, block = heapq.heappop(events)
        st = state[block]
        head, b = divmod(block, kv_tiles)
        step = st["step"]
        if step == q_tiles:
            continue
        t = order.tile_at(b, step)
        # the consumer's piece of this step: a tile after the last, once the writer read the last
        piece = max(st["ready"] + tile, st["read"] if st["read"] is not None else 0.0)
        if deterministic:
            key = (head, b % chains, t)
            turn = order.turn(b, t)
            releases = semaphore.setdefault(key, [])
            if len(releases) < turn:
                waiting[key + (turn,)] = block
                continue
            granted = max(time, st["released"], releases[turn - 1] if turn else 0.0)
        else:
            granted = max(time, st["read"] if st["read"] is not None else 0.0)
        read_done = max(granted, piece) + read
        released = read_done + (complete if deterministic else 0.0)
        st.update(ready=piece, read=read_done, released=released, step=step + 1)
        if deterministic:
            releases.append(released)
            waiter = waiting.pop(key + (len(releases),), None)
            if waiter is not None:
                push(released, waiter)
        if st["step"] < q_tiles:
            push(released if deterministic else read_done, block)
        else:
            done = max(piece + end, released)
            spans[block] = (st["t0"], done)
            clock = max(clock, done)
            finished += 1
            if claimed < limit:
                start_next(done + gap)
            elif finished == limit and group_index + 1 < len(groups):
                group_index += 1
                limit = groups[group_index][1] * kv_tiles
                for _ in range(min(resident, limit - claimed)):
                    start_next(done + gap, True)
    if len(spans) != total:
        raise SystemExit(f"det_chain_model: {total - len(spans)} blocks never finished (a cycle)")
    return clock, sorted(e - s for s, e in spans.values())


def report(name, heads, kv_tiles, q_tiles, resident=132, chains=2, **extra):
    base, base_spans = simulate(heads, kv_tiles, q_tiles, resident, deterministic=False, **extra)
    line = [f"{name}: default {base:.1f} us (median block {base_spans[len(base_spans) // 2]:.1f})"]
    for label, kwargs in (("rotated, one grid", {}),
                          ("rotated, launches of whole heads", {"launch_heads": max(1, resident // kv_tiles)}),
                          ("not rotated", {"rotate": False})):
        grid, spans = simulate(heads, kv_tiles, q_tiles, resident, chains=chains, **{**extra, **kwargs})
        line.append(f"  {label}: {grid:.1f} us ({grid / base:.3f} of default), median block "
                    f"{spans[len(spans) // 2]:.1f}, slowest {spans[-1]:.1f}")
    return "\n".join(line)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    print(report("1x8x4096x8192 D128 (headline)", 8, 64, 64))
    print(report("1x1x4096x8192 D128 (one head)", 1, 64, 64))
    print(report("1x32x4096x4096 D128", 32, 32, 64, chains=1))


if __name__ == "__main__":
    main()
