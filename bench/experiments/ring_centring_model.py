#!/usr/bin/env python3
"""Stage 11's centred dQ over a ring's blocks, and the ring's centred keys, modelled in NumPy on
the host (no GPU): what the errors of the choices are, at the shapes of the ring's GPU tests.

Stage 11 (and 07) compute dQ_i = scale (sum_j dS_ij K_j - rowsum(dS)_i c), c the mean of the
call's keys, dS = P (dP - delta), delta = rowsum(dO * O) from the bf16 O. The model keeps that
arithmetic in FP64 with the two roundings that matter here: O rounded to bf16 (so delta is off
and rowsum(dS) is not 0 over a whole row, which is what the centring is for), and, for the
ring's centred keys, bf16(K - c). It leaves out the kernels' own roundings (P and dS to bf16 for
the tensor cores, FP32 sums), which add about the same to every column of the table. Inputs as
the suite's: randn + 0.5, rounded to bf16; with an offset, the keys each GPU holds are moved by
offset * s_r in even head-dim columns and -offset * s_r in odd ones, s = 1, -1, 1/2, -1/2, 3/2,
-3/2, 1/4, -1/4 (offset_keys_by_gpu in 13_ring_attention/ring_host.cpp). A ring's calls are
modelled as one call per GPU block (contiguous: one run; zigzag: its two chunks together).

Columns (relative L2 error against the FP64 gradient of the same bf16 inputs; lse: largest
absolute error):
  stage11   one call over the whole sequence: c = the mean of all keys (stage 11 on one GPU)
  per-call  the ring with stage 11's default: each GPU's block centred by its own keys' mean
  ring      the ring as built: K centred once by the mean of all keys (bf16(K - c)), forward
            and backward on those keys, the LSE moved by scale q . c, calls uncentred
  ring-11   the ring's dQ against stage 11's (what the GPU tests' long shapes compare)
  lse       the ring's LSE (moved back) against the exact LSE of the given keys
  bwd-only  dQ of the alternative not built: the forward on the keys as given, the backward on
            bf16(K - c) with the forward's LSE less scale q . c (P then no longer sums to 1)
Last, uncentred dQ (centred_dq = false on the keys as given) against centred, keys of mean 0
and 0.5: why the uncentred GPU case of the shared suite draws its keys with mean 0.

usage: ring_centring_model.py [--quick]   (needs numpy; about two minutes, --quick a few seconds)
"""
import argparse
import sys

import numpy as np

SIGNS = np.array([1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 0.25, -0.25])


def bf16(x):
    """Round to the nearest bf16 (ties to even), returned as float64."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def probabilities(q, k, scale, causal, lse=None):
    s = scale * q @ k.T
    if causal:
        s = np.where(np.tril(np.ones(s.shape, bool)), s, -np.inf)
    if lse is None:
        m = s.max(1, keepdims=True)
        lse = (m + np.log(np.exp(s - m).sum(1, keepdims=True)))[:, 0]
    return np.exp(s - lse[:, None]), lse


def ds_of(p, v, dout, o_for_delta):
    return p * (dout @ v.T - (dout * o_for_delta).sum(1, keepdims=True))


def relative(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def owners(n, gpus, sharding):
    """The GPU that holds each token (contiguous: runs; zigzag: chunk r and 2P - 1 - r)."""
    if sharding == "contiguous":
        return np.minimum(np.arange(n) * gpus // n, gpus - 1)
    chunk = np.minimum(np.arange(n) * 2 * gpus // n, 2 * gpus - 1)
    return np.where(chunk < gpus, chunk, 2 * gpus - 1 - chunk)


def case(rng, n, d, causal, gpus, sharding, offset, q_scale=1.0):
    scale = 1 / np.sqrt(d)
    q = bf16(rng.normal(0.5, 1, (n, d)) * q_scale)
    k = rng.normal(0.5, 1, (n, d))
    v, dout = (bf16(rng.normal(0.5, 1, (n, d))) for _ in range(2))
    owner = owners(n, gpus, sharding)
    columns = np.where(np.arange(d) % 2 == 0, 1.0, -1.0)
    k = bf16(k + offset * SIGNS[owner % 8][:, None] * columns[None, :])
    # exact
    p, lse = probabilities(q, k, scale, causal)
    o = p @ v
    ds = ds_of(p, v, dout, o)
    dq, dk, dv = scale * ds @ k, scale * ds.T @ q, p.T @ dout
    # stage 11 on the whole sequence, and the ring with per-call centring: delta from the bf16 O
    ds_b = ds_of(p, v, dout, bf16(o))
    c = k.mean(0)
    stage11 = scale * (ds_b @ k - ds_b.sum(1, keepdims=True) * c)
    per_call = np.zeros_like(dq)
    for r in range(gpus):
        mine = owner == r
        per_call += scale * (ds_b[:, mine] @ k[mine] - ds_b[:, mine].sum(1, keepdims=True) * k[mine].mean(0))
    # the ring as built: bf16(K - c) in both passes, the LSE moved back by scale q . c
    c32 = c.astype(np.float32).astype(np.float64)
    k_centred = bf16(k - c32)
    p_r, lse_r = probabilities(q, k_centred, scale, causal)
    o_r = p_r @ v
    ds_r = ds_of(p_r, v, dout, bf16(o_r))
    ring_dq, ring_dk, ring_dv = scale * ds_r @ k_centred, scale * ds_r.T @ q, p_r.T @ dout
    lse_back = lse_r + scale * q @ c32
    # the alternative: only the backward on the centred keys, with the forward's O and LSE
    p_w, _ = probabilities(q, k_centred, scale, causal, lse=lse - scale * q @ c32)
    bwd_only = scale * ds_of(p_w, v, dout, bf16(o)) @ k_centred
    return {"stage11": relative(stage11, dq), "per-call": relative(per_call, dq),
            "ring": relative(ring_dq, dq), "ring-11": relative(ring_dq, stage11),
            "ring dk": relative(ring_dk, dk), "ring dv": relative(ring_dv, dv),
            "lse": np.abs(lse_back - lse).max(), "bwd-only": relative(bwd_only, dq)}


def uncentred(rng, n, d, causal, key_mean):
    scale = 1 / np.sqrt(d)
    q, v, dout = (bf16(rng.normal(0.5, 1, (n, d))) for _ in range(3))
    k = bf16(rng.normal(key_mean, 1, (n, d)))
    p, _ = probabilities(q, k, scale, causal)
    o = p @ v
    dq = scale * ds_of(p, v, dout, o) @ k
    ds_b = ds_of(p, v, dout, bf16(o))
    centred = scale * (ds_b @ k - ds_b.sum(1, keepdims=True) * k.mean(0))
    return relative(centred, dq), relative(scale * ds_b @ k, dq)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the two small shapes only")
    arguments = parser.parse_args()
    rng = np.random.default_rng(20261125)
    shapes = [(519, 2), (1039, 4)] + ([] if arguments.quick else [(4099, 2), (4099, 8)])
    names = ["stage11", "per-call", "ring", "ring-11", "ring dk", "ring dv", "lse", "bwd-only"]
    print(f"{'N':>5} {'D':>3} {'causal':>6} {'P':>2} {'sharding':>10} {'offset':>6} | " +
          " ".join(f"{name:>8}" for name in names))
    for n, gpus in shapes:
        for d in (64, 128):
            for causal in (False, True):
                for sharding in ("contiguous", "zigzag"):
                    for offset in (0.0, 0.25):
                        row = case(rng, n, d, causal, gpus, sharding, offset)
                        print(f"{n:>5} {d:>3} {int(causal):>6} {gpus:>2} {sharding:>10} {offset:>6} | " +
                              " ".join(f"{row[name]:>8.1e}" for name in names))
                        sys.stdout.flush()
    print("\nPeaked rows (q scaled by 3 and 6; N = 519, P = 2, zigzag, no offset): the ring's extra "
          "rounding grows with the scores")
    for d in (64, 128):
        for q_scale in (3.0, 6.0):
            row = case(rng, 519, d, True, 2, "zigzag", 0.0, q_scale)
            print(f"  D={d:>3} causal q x{q_scale:.0f}: " + " ".join(f"{name} {row[name]:.1e}" for name in names))
    print("\nUncentred dQ (centred_dq = false on the keys as given) against centred, vs FP64:")
    for n in (1000, 2051):
        for d in (64, 128):
            for causal in (False, True):
                for key_mean in (0.0, 0.5):
                    centred, plain = uncentred(rng, n, d, causal, key_mean)
                    print(f"  N={n:>4} D={d:>3} causal={int(causal)} key mean {key_mean}: centred {centred:.1e}, "
                          f"uncentred {plain:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
