#!/usr/bin/env python3
"""Pairs the rows of two driver CSVs run alternately (s2-s12.sh: main's stage 12, then the branch's,
per round): per shape and round, old's median ms over new's (> 1: new faster).

    python3 docs/profiles/12_persistent/counter-h100/ab_pairs.py ab-old.csv ab-new.csv
"""
import csv
import sys

old, new = (list(csv.DictReader(open(path))) for path in sys.argv[1:3])
print("# stage 12 on main (static stride for non-causal calls, 'old') and with the counter for long")
print("# non-causal calls (16+ work tiles per SM, 'new'), one H100 (call S2), alternating per round;")
print("# 1x32x4096x4096 has 7.8 tiles per SM, so both run the same code there: its rows are an A/A.")
print(f"{'shape':<22}{'round':>6}{'old ms':>10}{'new ms':>10}{'old/new':>9}")
for o, n in zip(old, new):
    shape = "x".join(o[c] for c in ("batch", "heads", "len_q", "len_kv", "head_dim"))
    print(f"{shape:<22}{o['commit'].split('-')[-1]:>6}{float(o['median_ms']):>10.3f}{float(n['median_ms']):>10.3f}"
          f"{float(o['median_ms']) / float(n['median_ms']):>9.3f}")
