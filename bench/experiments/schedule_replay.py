#!/usr/bin/env python3
"""Replays bench/driver.py's turns on a committed run's times, without a GPU: for each group of
implementations timed together (one shape and pass, the heavy ones left out as the driver
leaves them out), every member's call is taken to last its row's median_ms, and the turns are
played by a rule until every member is done by the driver's own Resident.done() constants.

Rules:
  now        the driver's rule until efa132a (5 ms slices): a member takes
             ceil(SLICE_SECONDS / call) calls a turn and stops when its own window is full;
  equal      every member takes about the same time a turn: round(T / call) calls, T the longest
             call of the group below LONG_CALL_MS (at least SLICE_SECONDS); each stops when full;
  equal+keep as equal, and a member that is done keeps its turns until the last is done (calls of
             LONG_CALL_MS or more excepted);
  credit     short turns with equal time on average: each member gains SLICE_SECONDS of credit a
             turn and issues the calls it covers (round(credit / call), none when that is 0, one
             at least for a call of LONG_CALL_MS or more), keeping the rest (a capped short
             call's surplus up to one slice);
  credit+window  as credit, with one window for the group: the longest of its members' windows
             (a member of calls under POWER_CALL_MS fills POWER_TIMED_SECONDS when another fills
             it), so that members on either side of POWER_CALL_MS stop together: the driver's
             rule since efa132a;
  credit+calls   as credit+window, the group's window also long enough for every member's
             MIN_CALLS calls (at most MAX_TIMED_SECONDS), so that a member of long calls does
             not go on alone after the others have their window;
  credit+ratios  as credit+calls, over the members a printed ratio compares (the stages, cuDNN
             and FlashAttention-2: driver.compared_in_ratios); the others as credit+window.

It prints the seconds of timed calls each rule spends over the whole run (the run's length is
that plus issue, sleeps and set-up), how finely each rule interleaves (over the BF16 groups, the
fewest turns any member's calls are spread over, and the longest block of calls one member
issues in a turn: the clock swings over 100-200 ms, so a member needs many short blocks for its
median to see the same clock as the others'), and for each rule the groups whose last member ends
furthest after the one before it (the share of the group's turns its last member runs alone,
against a clock that keeps moving), with every member's last turn for two groups named on the
command line. A model: real calls vary, and the driver reads the first call's length from an
untimed call.

usage: schedule_replay.py RESULTS.csv [--show B,H,Lq,Lk,D,causal,fwd|bwd ...]
"""

import argparse
import collections
import csv
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import driver as D  # noqa: E402

HEAVY = {"00_naive", "cublas_fp32", "cublas_bf16", "torch_math", "torch_eager"}  # timed alone


def rule_of(call_ms):
    long_call = call_ms >= D.LONG_CALL_MS
    min_calls = D.LONG_MIN_CALLS if long_call else D.MIN_CALLS
    max_seconds = D.LONG_MAX_TIMED_SECONDS if long_call else D.MAX_TIMED_SECONDS
    window = D.POWER_TIMED_SECONDS if D.POWER_CALL_MS <= call_ms < D.LONG_CALL_MS else D.TIMED_SECONDS
    return long_call, min_calls, max_seconds, window


def replay(calls_ms, rule, stats=None, names=None):
    """(seconds of timed calls, each member's last turn); stats, a dict, gets each member's
    number of turns with calls and its longest block of calls in one turn (ms)."""
    n = len(calls_ms)
    timed, count, last = [0.0] * n, [0] * n, [0] * n
    credit, turns_with_calls, block = [0.0] * n, [0] * n, [0.0] * n
    group_window = max(rule_of(t)[3] for t in calls_ms if t < D.LONG_CALL_MS) if any(
        t < D.LONG_CALL_MS for t in calls_ms) else D.TIMED_SECONDS
    # credit+calls: the group's window also covers each member's MIN_CALLS calls (up to
    # MAX_TIMED_SECONDS), so that a member of long calls does not run on alone for its count.
    calls_window = max([min(max(rule_of(t)[3], D.MIN_CALLS * t / 1e3), D.MAX_TIMED_SECONDS)
                        for t in calls_ms if t < D.LONG_CALL_MS] or [D.TIMED_SECONDS])
    # credit+ratios: the same, over the members a printed ratio compares (the stages, cuDNN and
    # FlashAttention-2); the others keep credit+window's.
    compared = [t for t, name in zip(calls_ms, names or [""] * n)
                if t < D.LONG_CALL_MS and D.compared_in_ratios(name.split("/")[0])]
    ratios_window = max([group_window] + [min(max(rule_of(t)[3], D.MIN_CALLS * t / 1e3), D.MAX_TIMED_SECONDS)
                                          for t in compared])

    def done(i):
        long_call, min_calls, max_seconds, window = rule_of(calls_ms[i])
        if rule == "credit+window" and not long_call:
            window = group_window
        if rule == "credit+calls" and not long_call:
            window = calls_window
        if rule == "credit+ratios" and not long_call:
            window = ratios_window if D.compared_in_ratios((names or [""] * n)[i].split("/")[0]) else group_window
        return (count[i] >= D.MAX_CALLS or timed[i] >= max_seconds * 1e3
                or (timed[i] >= window * 1e3 and count[i] >= min_calls))

    short = [t for t in calls_ms if t < D.LONG_CALL_MS]
    turn_ms = max([D.SLICE_SECONDS * 1e3] + short)
    turn = 0
    while not all(done(i) for i in range(n)):
        if rule == "equal+keep":
            running = [i for i in range(n) if not done(i) or calls_ms[i] < D.LONG_CALL_MS]
        else:
            running = [i for i in range(n) if not done(i)]
        for i in running:
            if rule == "now":
                calls = max(1, math.ceil(D.SLICE_SECONDS * 1e3 / calls_ms[i]))
            elif rule.startswith("credit"):
                credit[i] += D.SLICE_SECONDS * 1e3
                calls = round(credit[i] / calls_ms[i])
                if calls_ms[i] >= D.LONG_CALL_MS:
                    calls = max(calls, 1)
            else:
                calls = max(1, round(turn_ms / calls_ms[i]))
            wanted = calls
            calls = min(calls, math.ceil(D.MAX_CALLS * D.SLICE_SECONDS / D.TIMED_SECONDS),
                        max(1, D.MAX_CALLS - count[i]))
            if rule.startswith("credit"):
                credit[i] -= calls * calls_ms[i]
                if calls < wanted:
                    credit[i] = min(credit[i], D.SLICE_SECONDS * 1e3)
            if calls == 0:
                continue
            count[i] += calls
            timed[i] += calls * calls_ms[i]
            last[i] = turn + 1
            turns_with_calls[i] += 1
            block[i] = max(block[i], calls * calls_ms[i])
        turn += 1
    if stats is not None:
        stats["turns"], stats["block"] = turns_with_calls, block
    return sum(timed) / 1e3, last


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results")
    parser.add_argument("--show", action="append", default=[])
    arguments = parser.parse_args()
    groups = collections.defaultdict(list)
    for row in csv.DictReader(open(arguments.results)):
        if row["status"] != "ok" or row["stage"] in HEAVY:
            continue
        step = "fwd" if row["pass"] == "fwd" else "bwd"
        key = ",".join([row["batch"], row["heads"], row["len_q"], row["len_kv"], row["head_dim"],
                        row["causal"], step])
        groups[(row["dtype"], key)].append((row["stage"] + ("/" + row["pass"] if row["pass"] == "bwd_det" else ""),
                                            float(row["median_ms"])))
    rules = ["now", "equal", "equal+keep", "credit", "credit+window", "credit+calls", "credit+ratios"]
    print(f"replay of {arguments.results}: {len(groups)} groups (heavy implementations left out)")
    for rule in rules:
        total = sum(replay([t for _, t in members], rule, names=[m for m, _ in members])[0] for members in groups.values())
        print(f"  {rule:11s} {total:7.1f} s of timed calls")
    print("interleaving over the BF16 groups (members of calls under LONG_CALL_MS):")
    for rule in rules:
        fewest, longest = None, 0.0
        for (dtype, key), members in groups.items():
            if dtype != "bf16" or len(members) < 2:
                continue
            stats = {}
            replay([t for _, t in members], rule, stats, names=[m for m, _ in members])
            for (name, t), turns, block in zip(members, stats["turns"], stats["block"]):
                if t >= D.LONG_CALL_MS:
                    continue
                if fewest is None or turns < fewest[0]:
                    fewest = (turns, name, key)
                longest = max(longest, block)
        print(f"  {rule:13s} fewest turns {fewest[0]} ({fewest[1]} at {fewest[2]}), "
              f"longest block {longest:.1f} ms")
    for rule in rules:
        tails = []
        for (dtype, key), members in groups.items():
            if dtype != "bf16" or len(members) < 2:
                continue
            last = sorted(replay([t for _, t in members], rule, names=[m for m, _ in members])[1])
            tails.append(((last[-1] - last[-2]) / last[-1], key))
        tails.sort(reverse=True)
        print(f"{rule}: BF16 groups whose last member runs alone longest (share of the group's turns)")
        for share, key in tails[:4]:
            print(f"  {key:28s} {share:.2f}")
    for key in arguments.show:
        members = groups.get(("bf16", key))
        if not members:
            print(f"{key}: no such BF16 group")
            continue
        print(f"{key}: each member's last turn (call ms)")
        for rule in rules:
            last = replay([t for _, t in members], rule, names=[m for m, _ in members])[1]
            print(f"  {rule:11s} " + ", ".join(f"{name} {turn} ({t:.3g})"
                                               for (name, t), turn in zip(members, last)))


if __name__ == "__main__":
    main()
