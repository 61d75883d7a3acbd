#!/usr/bin/env python3
"""Why the ring's dQ and stage 11's differ at the long shapes of the ring's GPU tests, modelled in
NumPy on the host (no GPU): the arithmetic of both, with the roundings that the contract fixes.

Stage 11 on one GPU writes O = bf16(O) and its backward takes delta_i = rowsum(dO * O) from that
bf16 O, dS = P (dP - delta), and dQ = bf16(scale (dS K - rowsum(dS) c)), c the mean of all keys.
The ring's forward rounds each call's output to bf16, merges the calls in FP32 and rounds once
more; its backward takes delta from that O, and each call of stage 11 writes its dQ, dK, dV in
bf16 (centred by the same c), which the ring adds in FP32 and rounds once at the end. Kept here:
exactly those roundings. Left out: the kernels' own (P and dS to bf16 for the tensor cores, FP32
sums), which both sides share and which add about 1e-3 to every column. Inputs as the suite's:
randn + 0.5, rounded to bf16. A call is one (query piece, key piece) pair of the sharding
(contiguous: P runs; zigzag: 2P chunks; striped: P stripes), as block_calls makes them; a call
exists for a query row when it attends at least one of the piece's keys.

Columns, relative L2 (against the FP64 result of the same bf16 inputs, or against stage 11 where
it says so):
  o 11, o ring the O of stage 11 and of the ring against FP64
  o ring-11    the ring's O against stage 11's
  dq 11        stage 11's dQ against FP64
  dq ring      the ring's dQ against FP64
  dq ring32    the same with the calls' dQ added unrounded (one rounding at the end): what an FP32
               dQ out of every call would give (stage 11 has no such output)
  dq ring-11   the ring's dQ against stage 11's, each from its own forward: what the GPU test of
               the long shapes compared (its limit 1e-2)
  same-o       the ring's dQ against stage 11's backward given the ring's O and LSE: what the test
               compares now (the ring's backward alone). In this model that is exactly the cost of
               rounding each call's dQ to bf16 before the FP32 sum: with the calls added unrounded
               the two would be equal.
  dk ring-11, dv ring-11   as dq ring-11
  delta        || delta(ring's O) - delta(stage 11's O) || / || delta(exact O) - delta(stage 11's O) ||

usage: ring_dq_model.py [--quick] [--heads H]
  (needs numpy; about 12 minutes on two cores, --quick the 4099 shapes alone in under a minute)
"""
import argparse
import sys
import time

import numpy as np


def bf16(x):
    """Round to the nearest bf16 (ties to even), returned as float64."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def pieces(n, gpus, sharding):
    """The piece of every token (the first pieces one token longer where n does not divide)."""
    if sharding == "striped":
        return np.arange(n) % gpus
    count = gpus if sharding == "contiguous" else 2 * gpus
    return np.concatenate([np.full(len(part), i) for i, part in enumerate(np.array_split(np.arange(n), count))])


def relative(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def head(rng, n, d, causal, gpus, sharding, rows=1024):
    """One (batch, head): the sums of squares that the relative errors are made of."""
    scale = 1 / np.sqrt(d)
    q, k, v, dout = (bf16(rng.normal(0.5, 1, (n, d))) for _ in range(4))
    c = k.mean(0).astype(np.float32).astype(np.float64)  # the ring's key_centre (FP32)
    piece = pieces(n, gpus, sharding)
    groups = [np.flatnonzero(piece == g) for g in range(piece.max() + 1)]
    # dK, dV: one FP64 partial per query piece (what each call contributes to the travelling sums).
    dk_e = np.zeros((n, d)); dk_11 = np.zeros((n, d)); dv = np.zeros((n, d))
    dk_r_parts = np.zeros((len(groups), n, d)); dv_parts = np.zeros((len(groups), n, d))
    out = {name: [] for name in ("o11", "oring", "oe", "dq_e", "dq_11", "dq_r", "dq_11r", "de", "d11", "dr")}
    for start in range(0, n, rows):
        i = np.arange(start, min(n, start + rows))
        s = scale * q[i] @ k.T
        if causal:
            s = np.where(np.arange(n)[None, :] <= i[:, None], s, -np.inf)
        m = s.max(1, keepdims=True)
        p = np.exp(s - m)
        p /= p.sum(1, keepdims=True)
        o_exact = p @ v
        # the ring's forward: each call's output rounded, merged (FP32 on the GPU), rounded once more
        o_ring = np.zeros_like(o_exact)
        for g in groups:
            w = p[:, g].sum(1)
            has = w > 0
            o_ring[has] += w[has, None] * bf16((p[has][:, g] @ v[g]) / w[has, None])
        o_ring = bf16(o_ring)
        o_11 = bf16(o_exact)
        delta_e = (dout[i] * o_exact).sum(1)
        delta_11 = (dout[i] * o_11).sum(1)
        delta_r = (dout[i] * o_ring).sum(1)
        ds_e = p * (dout[i] @ v.T - delta_e[:, None])

        # dQ: per key piece g, dS_g K_g - rowsum(dS_g) c, for delta_x = delta_e - e as
        # (ds_e K - rowsum(ds_e) c)_g + e (P_g K_g - rowsum(P_g) c)
        ab = []
        for g in groups:
            ds_g, p_g = ds_e[:, g], p[:, g]
            ab.append((ds_g @ k[g] - ds_g.sum(1, keepdims=True) * c, p_g @ k[g] - p_g.sum(1, keepdims=True) * c))

        def dq_parts(error):
            return [scale * (a + error[:, None] * b) for a, b in ab]

        parts_e, parts_11, parts_r = dq_parts(0 * delta_e), dq_parts(delta_e - delta_11), dq_parts(delta_e - delta_r)
        out["dq_e"].append(sum(parts_e))
        out["dq_11"].append(bf16(sum(parts_11)))                  # stage 11: one call, rounded once
        out["dq_11r"].append(bf16(sum(parts_r)))                  # stage 11 given the ring's O
        out["dq_r"].append(bf16(sum(bf16(x) for x in parts_r)))   # the ring: every call rounded
        for name, x in (("o11", o_11), ("oring", o_ring), ("oe", o_exact),
                        ("de", delta_e), ("d11", delta_11), ("dr", delta_r)):
            out[name].append(x)
        # dK, dV
        dk_e += scale * ds_e.T @ q[i]
        dk_11 += scale * (ds_e + p * (delta_e - delta_11)[:, None]).T @ q[i]
        ds_r = ds_e + p * (delta_e - delta_r)[:, None]
        for h, g in enumerate(groups):
            rows_h = np.isin(i, g)
            if rows_h.any():
                dk_r_parts[h] += scale * ds_r[rows_h].T @ q[i[rows_h]]
                dv_parts[h] += p[rows_h].T @ dout[i[rows_h]]
        dv += p.T @ dout[i]
    whole = {name: np.concatenate(x) for name, x in out.items()}
    whole["dk_e"], whole["dk_11"], whole["dk_r"] = dk_e, bf16(dk_11), bf16(bf16(dk_r_parts).sum(0))
    whole["dv_e"], whole["dv_11"], whole["dv_r"] = dv, bf16(dv), bf16(bf16(dv_parts).sum(0))
    return whole


def case(rng, n, d, causal, gpus, sharding, heads):
    hs = [head(rng, n, d, causal, gpus, sharding) for _ in range(heads)]
    cat = {name: np.concatenate([h[name] for h in hs]) for name in hs[0]}
    return {
        "o 11": relative(cat["o11"], cat["oe"]),
        "o ring": relative(cat["oring"], cat["oe"]),
        "o ring-11": relative(cat["oring"], cat["o11"]),
        "dq 11": relative(cat["dq_11"], cat["dq_e"]),
        "dq ring": relative(cat["dq_r"], cat["dq_e"]),
        "dq ring32": relative(cat["dq_11r"], cat["dq_e"]),
        "dq ring-11": relative(cat["dq_r"], cat["dq_11"]),
        "same-o": relative(cat["dq_r"], cat["dq_11r"]),
        "dk ring-11": relative(cat["dk_r"], cat["dk_11"]),
        "dv ring-11": relative(cat["dv_r"], cat["dv_11"]),
        "delta": np.linalg.norm(cat["dr"] - cat["d11"]) / np.linalg.norm(cat["de"] - cat["d11"]),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the 4099 shapes only")
    parser.add_argument("--heads", type=int, default=4, help="heads per case (the GPU test's: 4)")
    arguments = parser.parse_args()
    rng = np.random.default_rng(20261126)
    names = ["o 11", "o ring", "o ring-11", "dq 11", "dq ring", "dq ring32", "dq ring-11", "same-o", "dk ring-11", "dv ring-11",
             "delta"]
    print(f"# B=1 H={arguments.heads} N=N D=D, P=2, inputs randn + 0.5 rounded to bf16; relative L2 (see the docstring)")
    print(f"{'N':>5} {'D':>3} {'causal':>6} {'sharding':>10} | " + " ".join(f"{name:>11}" for name in names))
    lengths = (4099,) if arguments.quick else (4099, 16383)
    for n in lengths:
        for d in (64, 128):
            for causal in (False, True):
                for sharding in ("contiguous", "zigzag", "striped"):
                    began = time.time()
                    row = case(rng, n, d, causal, 2, sharding, arguments.heads)
                    print(f"{n:>5} {d:>3} {int(causal):>6} {sharding:>10} | " +
                          " ".join(f"{row[name]:>11.2e}" for name in names))
                    print(f"# {time.time() - began:.0f} s", file=sys.stderr)
                    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
