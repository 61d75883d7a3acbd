# Progressive conversion stress: the stage's dQ against 11_main's (same inputs), many calls, several
# shapes; a tile converted before all its sums landed shows as a large difference.
import sys, torch
sys.path.insert(0, "common")
import stage_abi
new, old = stage_abi.load(sys.argv[1]), stage_abi.load("11_main")
worst = 0.0
for dims, causal in [((1, 32, 4096, 4096, 128), False), ((1, 8, 4096, 8192, 128), False), ((2, 5, 1000, 3000, 128), True),
                     ((3, 7, 777, 1333, 64), False), ((1, 2, 300, 200, 128), False), ((4, 8, 2048, 2048, 64), True),
                     ((1, 1, 64, 70000, 128), False)]:
    shape = stage_abi.Shape(*dims, causal=causal)
    t = lambda L: torch.randn(shape.batch, shape.heads, L, shape.head_dim, device="cuda", dtype=torch.bfloat16)
    q, k, v, do = t(shape.len_q), t(shape.len_kv), t(shape.len_kv), t(shape.len_q)
    k += 2.0
    o = torch.empty_like(q); lse = torch.empty(shape.batch, shape.heads, shape.len_q, device="cuda")
    new.forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), shape)
    ref = [torch.empty_like(x) for x in (q, k, v)]
    old.backward(*[x.data_ptr() for x in (q, k, v, o, lse, do, *ref)], shape)
    torch.cuda.synchronize()
    shape_worst = 0.0
    for it in range(30):
        got = [torch.full_like(x, float("nan")) for x in (q, k, v)]
        new.backward(*[x.data_ptr() for x in (q, k, v, o, lse, do, *got)], shape)
        torch.cuda.synchronize()
        for name, g, r in zip("qkv", got, ref):
            rel = ((g.float() - r.float()).norm() / r.float().norm()).item()
            if not rel == rel: rel = float("inf")
            shape_worst = max(shape_worst, rel)
    worst = max(worst, shape_worst)
    print(f"{dims} causal={causal}: worst relative L2 difference to 11_main over 30 calls {shape_worst:.3e}", flush=True)
print("STRESS", "ok" if worst < 2e-2 else "FAILED", f"worst {worst:.3e}")
