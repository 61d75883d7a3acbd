#!/usr/bin/env python3
"""Stage 11's backward, default and deterministic, against an FP64 reference on the GPU.

For each case: Q, K, V, dO drawn at random (bf16), O and LSE from the stage's own forward, the
gradients of the FP64 attention by torch.autograd, then the stage's backward in both modes.
Prints each gradient's relative L2 error (||x - ref|| / ||ref||), the largest error of a query
row of dQ relative to that row's norm (the fixed-point dQ rounds each row to a step set by the
row's bound, so a row much smaller than its bound is where it would show), and whether three
deterministic runs agree bit for bit. The cases stress the bound: rows of dO whose norms span
six orders of magnitude, keys with a large common part, key columns of very different sizes.

usage: python3 bench/experiments/det_accuracy.py [--stage 11_hopper_backward] [--csv FILE]
"""
import argparse
import csv
import math
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "common"))
import stage_abi  # noqa: E402

# name, batch, heads, len_q, len_kv, head_dim, causal, how the inputs are drawn
CASES = [
    ("plain", 1, 4, 2048, 4096, 128, False, "plain"),
    ("plain", 2, 4, 1000, 1000, 64, True, "plain"),
    ("keys of mean 0.5", 1, 4, 2048, 2048, 128, False, "key_mean"),
    ("dO rows 1e-3 to 1e3", 1, 4, 2048, 2048, 128, False, "row_scales"),
    ("dO rows 1e-3 to 1e3", 2, 4, 777, 1500, 64, True, "row_scales"),
    ("K columns 1e-2 to 1", 1, 4, 2048, 2048, 128, False, "column_scales"),
    ("keys of mean 5", 1, 4, 2048, 2048, 64, False, "big_key_mean"),
]


def inputs(batch, heads, len_q, len_kv, head_dim, kind, generator):
    def draw(*shape):
        return torch.randn(*shape, generator=generator, device="cuda", dtype=torch.float32)
    q, k, v = draw(batch, heads, len_q, head_dim), draw(batch, heads, len_kv, head_dim), draw(batch, heads, len_kv, head_dim)
    dout = draw(batch, heads, len_q, head_dim)
    if kind == "key_mean":
        k = k + 0.5
    elif kind == "big_key_mean":
        k = k + 5.0
    elif kind == "row_scales":
        exponents = torch.rand(batch, heads, len_q, 1, generator=generator, device="cuda") * 6 - 3
        dout = dout * torch.pow(10.0, exponents)
    elif kind == "column_scales":
        exponents = torch.rand(1, 1, 1, head_dim, generator=generator, device="cuda") * 2 - 2
        k = k * torch.pow(10.0, exponents)
    return [x.to(torch.bfloat16).contiguous() for x in (q, k, v, dout)]


def reference(q, k, v, dout, causal, scale):
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    s = torch.matmul(q64, k64.transpose(-1, -2)) * scale
    if causal:
        mask = torch.ones(s.shape[-2], s.shape[-1], device="cuda", dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    o = torch.matmul(p, v64)
    o.backward(dout.double())
    return q64.grad, k64.grad, v64.grad


def relative_l2(x, ref):
    return (x.double() - ref).norm().item() / max(ref.norm().item(), 1e-300)


def worst_row(x, ref):
    error = (x.double() - ref).norm(dim=-1)
    norm = ref.norm(dim=-1)
    keep = norm > 0
    return (error[keep] / norm[keep]).max().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", default="11_hopper_backward")
    parser.add_argument("--csv")
    args = parser.parse_args()
    stage = stage_abi.load(args.stage, ROOT)
    generator = torch.Generator(device="cuda").manual_seed(20261127)
    rows = []
    print(f"# {args.stage} on {torch.cuda.get_device_name()}: relative L2 error of each gradient against FP64; "
          "dQ row: the largest error of a query row over its norm")
    print(f"{'case':<22} {'shape':<24} {'mode':<14} {'dQ':>9} {'dK':>9} {'dV':>9} {'dQ row':>9}  same bits")
    for name, batch, heads, len_q, len_kv, head_dim, causal, kind in CASES:
        q, k, v, dout = inputs(batch, heads, len_q, len_kv, head_dim, kind, generator)
        scale = 1.0 / math.sqrt(head_dim)
        o = torch.empty_like(q)
        lse = torch.empty(batch, heads, len_q, device="cuda", dtype=torch.float32)
        shape = stage_abi.Shape(batch, heads, len_q, len_kv, head_dim, causal, scale)
        stage.forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), shape, 0)
        torch.cuda.synchronize()
        refs = reference(q, k, v, dout, causal, scale)
        for deterministic in (False, True):
            runs = []
            for _ in range(3 if deterministic else 1):
                grads = [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)]
                mode_shape = stage_abi.Shape(batch, heads, len_q, len_kv, head_dim, causal, scale,
                                             deterministic=deterministic)
                stage.backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                               dout.data_ptr(), *(g.data_ptr() for g in grads), mode_shape, 0)
                torch.cuda.synchronize()
                runs.append(grads)
            errors = [relative_l2(g, r) for g, r in zip(runs[0], refs)]
            row = worst_row(runs[0][0], refs[0])
            same = "-" if not deterministic else str(all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                                                         for run in runs[1:] for a, b in zip(runs[0], run)))
            mode = "deterministic" if deterministic else "default"
            label = f"{batch}x{heads}x{len_q}x{len_kv}x{head_dim}{' causal' if causal else ''}"
            print(f"{name:<22} {label:<24} {mode:<14} {errors[0]:9.2e} {errors[1]:9.2e} {errors[2]:9.2e} {row:9.2e}  {same}")
            rows.append({"case": name, "shape": label, "mode": mode, "dq": errors[0], "dk": errors[1],
                         "dv": errors[2], "dq_worst_row": row, "same_bits": same})
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
