"""ab.txt from cap-512k.csv and cap-1m.csv: capped pieces against --max-piece 0, and PyTorch.

Each bench_13_ring_attention row was tagged cap65536 or cap0 (a 20th column) by cap1.sh and cap2.sh.
Also splits each into {capped,uncapped}-<len>.csv in the benchmark's own columns (PyTorch's rows in
both), which bench/tables.py's value:ring markers read.
Run from the repository root: python3 docs/profiles/13_ring_attention/ring-piece-cap-h200/ab.py > ab.txt
"""
import csv
import pathlib

HERE = pathlib.Path(__file__).parent
print("Pieces capped at 65,536 tokens (the default) against --max-piece 0 (runs never cut), main 468129a's")
print("ring code, four H200s, B 1, H 32, D 128. Rows in the order they ran; speed-up = the next uncapped")
print("row's ms over the capped row's (same sharding, mask, pass). A/A = the ring's second call in each")
print("round over its first. eff = per-GPU TFLOP/s over stage 11 alone at 131,072 tokens on every GPU at once.\n")
for name, note in (("cap-512k.csv", "call C1: 131,072 tokens per GPU, contiguous non-causal, repeats 3, in the order cap, none, cap, none"),
                   ("cap-1m.csv", "call C2: 262,144 tokens per GPU (1,048,576 in all), repeats 1; PyTorch in the same call")):
    header, *rows = list(csv.reader(open(HERE / name)))
    for tag, part in (("cap65536", "capped"), ("cap0", "uncapped")):
        with open(HERE / name.replace("cap-", f"{part}-"), "w", newline="") as out:
            csv.writer(out, lineterminator="\n").writerows(
                [header] + [r[:19] for r in rows if len(r) == 19 or r[19] == tag])
    print(f"== {name}: {note}")
    print(f"{'sharding':<20}{'causal':>7}{'pass':>5}{'cap':>7}{'ms':>11}{'A/A':>7}{'eff':>7}")
    for r in rows:
        cap = r[19][3:] if len(r) > 19 else "-"
        aa = f"{float(r[16]) / float(r[9]):.3f}" if r[16] else ""
        print(f"{r[2]:<20}{r[7]:>7}{r[8]:>5}{cap:>7}{float(r[9]):>11.1f}{aa:>7}{r[15][:5]:>7}")
    for i, r in enumerate(rows):
        if len(r) > 19 and r[19] == "cap65536":
            after = [u for u in rows[i + 1:] if len(u) > 19 and u[19] == "cap0" and u[2:9] == r[2:9]]
            if after:
                print(f"  speed-up {r[2]} causal {r[7]} {r[8]}: {float(after[0][9]) / float(r[9]):.3f}")
            for t in rows:
                if t[2].startswith("torch") and t[7:9] == r[7:9]:
                    print(f"  PyTorch over the capped {r[2]} {r[8]}: {float(t[9]) / float(r[9]):.3f}x")
    print()
