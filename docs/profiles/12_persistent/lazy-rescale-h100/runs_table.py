"""The tables of lab notes 12's lazy-rescale section, from the CSVs of this folder and of the
make bench runs before it (the repository's paths). usage: python3 runs_table.py > summary.txt"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from tables import medians_by_shape  # noqa: E402  (the one reader of a results CSV)
RUNS = [("3ad30d2/1", "docs/profiles/all_stages/bench-pair-3ad30d2/run1/results.csv"),
        ("3ad30d2/2", "docs/profiles/all_stages/bench-pair-3ad30d2/run2/results.csv"),
        ("bfe58f2", "docs/profiles/all_stages/bench-bfe58f2/results.csv"),
        ("0006939", "bench/results/nvidia-h100-80gb-hbm3/results.csv"),
        ("eecda8f lazy", "docs/profiles/12_persistent/lazy-rescale-h100/bench-eecda8f/results.csv")]


def forward_medians(path):
    """{(stage, shape as BxHxLqxLkxDxcausal): median ms} of a run's BF16 forward rows that ran."""
    return {(stage, "x".join(str(v) for v in shape)): ms
            for shape, times in medians_by_shape(path).items() for stage, ms in times.items()}


def table(title, columns, shapes):
    print(title)
    print(f"{'shape':26s} " + " ".join(f"{name:>13s}" for name, _ in columns))
    for shape in shapes:
        print(f"{shape:26s} " + " ".join(f"{ratio(shape):13.3f}" if ratio(shape) else f"{'-':>13s}"
                                         for _, ratio in columns))
    print()


runs = [(name, forward_medians(os.path.join(ROOT, path))) for name, path in RUNS]
shapes = sorted({s for _, rows in runs for (stage, s) in rows if stage == "12_persistent" and "x128x" in s},
                key=lambda s: (s.endswith("1"), [int(x) for x in s.split("x")]))


def over(rows, num, den):
    return lambda s: rows[(num, s)] / rows[(den, s)] if (num, s) in rows and (den, s) in rows else None


table("# make bench: stage 10's forward time over stage 12's, D = 128 (the last run is the lazy rescale's)",
      [(name, over(rows, "10_pingpong", "12_persistent")) for name, rows in runs], shapes)
table("# make bench: cuDNN's forward time over stage 12's, D = 128",
      [(name, over(rows, "torch_cudnn", "12_persistent")) for name, rows in runs], shapes)
lz = [(f"LZ1/{i}", forward_medians(os.path.join(HERE, f"lz1-ab{i}.csv"))) for i in (1, 2)] + \
     [(f"LZ2/{i}", forward_medians(os.path.join(HERE, f"lz2-aa{i}.csv"))) for i in (1, 2)]
table("# driver runs without PyTorch: main's stage 12 (12_main) time over the branch's (12_persistent), and (A/A) "
      "12_main over its copy 12_main2",
      [(name + " lazy", over(rows, "12_main", "12_persistent")) for name, rows in lz] +
      [(name + " A/A", over(rows, "12_main", "12_main2")) for name, rows in lz if name.startswith("LZ2")], shapes)
lz3 = forward_medians(os.path.join(HERE, "lz3.csv"))
table("# LZ3, one driver run with PyTorch's baselines and stage 10 in the turns (make bench's way): the lazy rescale "
      "(12_lazy) and main's stage 12 (12_main), each against cuDNN and stage 10, and main over lazy",
      [("lazy/cuDNN", over(lz3, "torch_cudnn", "12_lazy")), ("main/cuDNN", over(lz3, "torch_cudnn", "12_main")),
       ("lazy/10", over(lz3, "10_pingpong", "12_lazy")), ("main/10", over(lz3, "10_pingpong", "12_main")),
       ("main/lazy", over(lz3, "12_main", "12_lazy"))], shapes)
pair = [(name, forward_medians(os.path.join(HERE, "pair", name, "results.csv"))) for name in ("main", "lazy")]
table("# the pair (call LP): make bench's BF16 headline and extra sweeps twice back to back on one H100, main's stage "
      "12 (43ff35c), then the lazy rescale (eecda8f's kernel): stage 12 against cuDNN and stage 10 in each run",
      [(f"{name}/cuDNN", over(rows, "torch_cudnn", "12_persistent")) for name, rows in pair] +
      [(f"{name}/10", over(rows, "10_pingpong", "12_persistent")) for name, rows in pair],
      sorted({s for _, rows in pair for (stage, s) in rows if stage == "12_persistent"}))
