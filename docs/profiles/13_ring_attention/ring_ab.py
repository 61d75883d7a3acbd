#!/usr/bin/env python3
"""Summarises an A/B of two ring builds run alternately (a CSV of bench_13_ring_attention rows with a
first column `build`, 'old' or 'new'): per row and round, each build's median ms, old over new (> 1:
new faster), the same for the kernel alone (the baseline column), and each run's A/A (its second
call over its first).

    python3 docs/profiles/13_ring_attention/ring_ab.py AB.csv "title line" ["title line" ...]

With more builds than two, `--against TAG` (first) names the one set against 'old' (default 'new').
"""
import csv
import sys

arguments = sys.argv[1:]
against = 'new'
if arguments[:1] == ['--against']:
    against, arguments = arguments[1], arguments[2:]
path, titles = arguments[0], arguments[1:]
rows = list(csv.DictReader(open(path)))
keys = []
for r in rows:
    key = (r['sharding'], int(r['len']), r['causal'], r['pass'])
    if key not in keys:
        keys.append(key)
for line in titles:
    print('# ' + line)
if against != 'new':
    print(f"# 'new' below is the build tagged '{against}'.")
print('# ring: the ring call\'s median ms; old/new: old\'s time over new\'s (> 1: new faster); alone: the')
print('# kernel alone at the tokens per GPU (the baseline), old over new; A/A: a run\'s second call over its first.')
print('# Made by: python3 docs/profiles/13_ring_attention/ring_ab.py ' + path.split('/')[-1] + ' "<title>".')
print(f"{'sharding':<11}{'tokens':>8} {'causal':>6} {'pass':>4} {'round':>5} {'old ms':>9} {'new ms':>9} "
      f"{'old/new':>8} {'alone old/new':>14} {'A/A old':>8} {'A/A new':>8}")
for key in keys:
    old = [r for r in rows if (r['sharding'], int(r['len']), r['causal'], r['pass']) == key and r['build'] == 'old']
    new = [r for r in rows if (r['sharding'], int(r['len']), r['causal'], r['pass']) == key and r['build'] == against]
    for i, (o, n) in enumerate(zip(old, new), 1):
        ms = lambda r, c: float(r[c])
        print(f"{key[0]:<11}{key[1]:>8} {key[2]:>6} {key[3]:>4} {i:>5} {ms(o, 'median_ms'):>9.2f} {ms(n, 'median_ms'):>9.2f} "
              f"{ms(o, 'median_ms') / ms(n, 'median_ms'):>8.3f} {ms(o, 'baseline_ms') / ms(n, 'baseline_ms'):>14.3f} "
              f"{ms(o, 'aa_median_ms') / ms(o, 'median_ms'):>8.3f} {ms(n, 'aa_median_ms') / ms(n, 'median_ms'):>8.3f}")
