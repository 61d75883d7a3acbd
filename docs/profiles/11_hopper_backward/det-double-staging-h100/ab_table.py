"""The table of lab notes 11's det-double-staging section: main's stage 11 (11_main) time over the
branch's (11_hopper_backward: two staging tiles in use) and over the probe's (11_one: the compact
layout with one in use), per shape and pass, from the driver runs of calls DS1 and DS2 (> 1: faster
than main). usage: python3 ab_table.py (from this folder) > summary.txt"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "..", "bench"))
from tables import medians_by_shape  # noqa: E402  (the one reader of a results CSV)


def medians(name):
    """{(stage, shape as BxHxLqxLkxDxcausal, pass): median ms} of every pass of a run's rows."""
    rows = {}
    for pass_name in ("fwd", "bwd", "bwd_det"):
        for shape, times in medians_by_shape(os.path.join(HERE, name), pass_name).items():
            for stage, ms in times.items():
                rows[(stage, "x".join(str(v) for v in shape), pass_name)] = ms
    return rows


runs = [("DS1", 1, medians("ds1-ab1.csv")), ("DS1", 2, medians("ds1-ab2.csv")),
        ("DS2", 1, medians("ds2-ab1.csv")), ("DS2", 2, medians("ds2-ab2.csv"))]
print("# main's stage 11 over the branch (two staging tiles in use) and over the probe (compact layout, one in use);")
print("# median times of bench/driver.py, every stage in the same turns; 11_one ran in DS2 only. ab_table.py made this.")
print(f"{'shape':26s} {'pass':8s} " + " ".join(f"{c}/{r} two" for c, r, _ in runs) + "  " +
      " ".join(f"{c}/{r} one" for c, r, _ in runs if c == "DS2"))
keys = sorted({(k[1], k[2]) for _, _, rows in runs for k in rows})
for shape, p in keys:
    two = []
    for _, _, rows in runs:
        a, b = rows.get(("11_main", shape, p)), rows.get(("11_hopper_backward", shape, p))
        two.append(f"{a / b:9.3f}" if a and b else f"{'-':>9s}")
    one = []
    for c, _, rows in runs:
        if c != "DS2":
            continue
        a, b = rows.get(("11_main", shape, p)), rows.get(("11_one", shape, p))
        one.append(f"{a / b:9.3f}" if a and b else f"{'-':>9s}")
    print(f"{shape:26s} {p:8s} " + " ".join(two) + "  " + " ".join(one))
