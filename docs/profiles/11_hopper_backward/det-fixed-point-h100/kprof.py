# Stage 11's backward in a loop of back-to-back calls (10 untimed, then 10 traced), default then
# deterministic: every kernel's median duration from CUPTI (torch.profiler), and the call's span.
import dataclasses, json, statistics, sys, collections, torch
sys.path.insert(0, "common")
import stage_abi
from torch.profiler import profile, ProfilerActivity
out = sys.argv[1]
for stage_name in sys.argv[2].split(","):
    lib = stage_abi.load(stage_name)
    for dims, causal in [((1, 8, 4096, 8192, 128), False), ((1, 32, 4096, 4096, 128), False), ((16, 16, 4096, 4096, 128), True), ((4, 8, 4096, 4096, 64), False)]:
        shape = stage_abi.Shape(*dims, causal=causal)
        t = lambda L: torch.randn(shape.batch, shape.heads, L, shape.head_dim, device="cuda", dtype=torch.bfloat16)
        q, k, v, do = t(shape.len_q), t(shape.len_kv), t(shape.len_kv), t(shape.len_q)
        o = torch.empty_like(q); lse = torch.empty(shape.batch, shape.heads, shape.len_q, device="cuda")
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        a = [x.data_ptr() for x in (q, k, v, o, lse, do, dq, dk, dv)]
        lib.forward(*a[:5], shape)
        for det in (False, True):
            s = dataclasses.replace(shape, deterministic=det)
            for _ in range(10): lib.backward(*a, s)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(10): lib.backward(*a, s)
                torch.cuda.synchronize()
            name = f"{out}/trace.json"
            p.export_chrome_trace(name)
            ev = [e for e in json.load(open(name))["traceEvents"] if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
            ev.sort(key=lambda e: e["ts"])
            by = collections.defaultdict(list)
            for e in ev: by[e["name"]].append(e["dur"])
            span = (ev[-1]["ts"] + ev[-1]["dur"] - ev[0]["ts"]) / 10
            print(f"== {stage_name} {'x'.join(map(str, dims))}{' causal' if causal else ''} {'deterministic' if det else 'default'}: per call {span:.1f} us", flush=True)
            for n, d in by.items():
                print(f"   {n[:90]:<90} median {statistics.median(d):8.1f} us ({len(d)})")
