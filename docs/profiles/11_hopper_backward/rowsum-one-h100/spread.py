# Run-to-run spread of dQ at (1, 1, 64, 70000, 128): each pair (A, B) of stages, B's calls against A's first call's dQ.
import sys, torch
sys.path.insert(0, "common")
import stage_abi
libs = {n: stage_abi.load(n) for n in ("11_main", "11_hopper_backward")}
torch.manual_seed(2)
for dims in [(1, 1, 64, 70000, 128), (1, 1, 64, 70000, 64)]:
    shape = stage_abi.Shape(*dims)
    b, h, lq, lk, d = dims
    t = lambda L: torch.randn(b, h, L, d, device="cuda", dtype=torch.bfloat16)
    q, k, v, do = t(lq), t(lk), t(lk), t(lq)
    k += 2.0
    o = torch.empty_like(q); lse = torch.empty(b, h, lq, device="cuda")
    libs["11_main"].forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), shape)
    def dq(lib):
        got = [torch.full_like(x, float("nan")) for x in (q, k, v)]
        lib.backward(*[x.data_ptr() for x in (q, k, v, o, lse, do, *got)], shape)
        torch.cuda.synchronize()
        return got[0].float()
    for a in libs:
        ref = dq(libs[a])
        for bname in libs:
            diffs = [((dq(libs[bname]) - ref).norm() / ref.norm()).item() for _ in range(60)]
            print(f"{dims} {bname} against {a}'s first call: median {sorted(diffs)[30]:.2e}, max {max(diffs):.2e}", flush=True)
