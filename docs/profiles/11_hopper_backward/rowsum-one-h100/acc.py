# Accuracy spread against FP64 at long-key shapes: each stage's dQ, dK, dV relative L2 error to the FP64 gradients over
# many calls (same inputs), min / max; a race shows as a max far above the min. Stages from argv.
import sys, torch
sys.path.insert(0, "common")
import stage_abi
stages = {name: stage_abi.load(name) for name in sys.argv[1:]}
torch.manual_seed(1)
for dims in [(1, 1, 64, 70000, 128), (1, 1, 64, 70000, 64), (1, 8, 4096, 8192, 128)]:
    shape = stage_abi.Shape(*dims)
    b, h, lq, lk, d = dims
    t = lambda L: torch.randn(b, h, L, d, device="cuda", dtype=torch.bfloat16)
    q, k, v, do = t(lq), t(lk), t(lk), t(lq)
    k += 2.0
    qd, kd, vd = [x.double().requires_grad_() for x in (q, k, v)]
    o_ref = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd)
    ref = torch.autograd.grad(o_ref, (qd, kd, vd), do.double())
    first = next(iter(stages.values()))
    o = torch.empty_like(q); lse = torch.empty(b, h, lq, device="cuda")
    first.forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), shape)
    for name, lib in stages.items():
        errs = {c: [] for c in "qkv"}
        for it in range(25 if lk > 10000 else 8):
            got = [torch.full_like(x, float("nan")) for x in (q, k, v)]
            lib.backward(*[x.data_ptr() for x in (q, k, v, o, lse, do, *got)], shape)
            torch.cuda.synchronize()
            for c, g, r in zip("qkv", got, ref):
                errs[c].append(((g.double() - r).norm() / r.norm()).item())
        print(f"{dims} {name}: " + "  ".join(f"d{c} {min(e):.3e}..{max(e):.3e}" for c, e in errs.items()), flush=True)
