#!/usr/bin/env python3
"""Host emulation of stage 07's roundings, to find where its dQ/dK error comes from.

Inputs are randn + 0.5 rounded to bf16, as in the tests. The FP64 gradient is compared with:
  base      D = rowsum(dO * bf16(O)), P from the FP32 LSE, P and dS rounded to bf16 before
            the products (what the first version of the kernels computed)
  exact_d   the same with D = rowsum(P * dP) (what the unrounded O would give)
  centred   base, with dQ = scale (dS K - rowsum(dS) mean(K)) (the kernels' remedy)
  stage07   centred, plus D = rowsum(P * dP) when len_kv <= 64 (one dK/dV block holds every key)
Prints the largest relative L2 error over a few random draws per shape.
Usage: python3 bench/experiments/07_backward-precision-emulation.py (its output: docs/profiles/07_backward/precision-emulation.txt)
"""
import numpy as np


def bf16(x):
    x = np.asarray(x, np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def errors(n, m, d, causal, rng, variant):
    q, k, v, do = (bf16(rng.normal(0.5, 1, shape)) for shape in ((n, d), (m, d), (m, d), (n, d)))
    scale = 1 / np.sqrt(d)
    mask = (np.arange(m)[None, :] <= np.arange(n)[:, None]) if causal else np.ones((n, m), bool)
    s = np.where(mask, q @ k.T * scale, -np.inf)
    lse = np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1)
    p = np.exp(s - lse[:, None])
    o = p @ v
    dp = do @ v.T
    ds = p * (dp - (p * dp).sum(1)[:, None])
    ref = (scale * ds @ k, scale * ds.T @ q, p.T @ do)

    p_k = np.where(mask, np.exp(s - lse.astype(np.float32)[:, None]), 0)
    delta = (do * bf16(o)).sum(1)
    if variant == "exact_d" or (variant == "stage07" and m <= 64):
        delta = (p_k * dp).sum(1)
    ds_k = p_k * (dp - delta[:, None])
    dq = scale * bf16(ds_k) @ k
    if variant in ("centred", "stage07"):
        dq = scale * (bf16(ds_k) @ k - ds_k.sum(1)[:, None] * k.mean(0)[None, :])
    out = (dq, scale * bf16(ds_k).T @ q, bf16(p_k).T @ do)
    return [np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300) for a, b in zip(out, ref)]


def main():
    rng = np.random.default_rng(2026)
    print("largest relative L2 error over the draws: dq dk dv")
    for n, m, d, causal in [(2, 2, 64, True), (2, 2, 128, False), (17, 17, 64, True),
                            (17, 1000, 64, False), (1000, 1000, 128, False),
                            (2051, 2051, 64, False), (2051, 2051, 128, True), (4099, 4099, 64, False)]:
        draws = 10 if n * m < 100000 else 1
        for variant in ("base", "exact_d", "centred", "stage07"):
            worst = np.max([errors(n, m, d, causal, rng, variant) for _ in range(draws)], axis=0)
            print(f"Lq={n:5d} Lk={m:5d} D={d:3d} causal={int(causal)} {variant:8s} "
                  f"dq {worst[0]:.4f}  dk {worst[1]:.4f}  dv {worst[2]:.4f}")


if __name__ == "__main__":
    main()
