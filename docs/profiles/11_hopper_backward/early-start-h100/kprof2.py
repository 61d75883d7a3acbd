# Per-call timeline of stage 11's default backward from CUPTI (torch.profiler): for 20 back-to-back
# calls, each kernel's start and end; medians of the spans between them.
import json, statistics, sys, torch
sys.path.insert(0, "common")
import stage_abi
from torch.profiler import profile, ProfilerActivity
out = sys.argv[1]
for stage_name in sys.argv[2].split(","):
    lib = stage_abi.load(stage_name)
    import os
    shapes = [((1, 8, 4096, 8192, 128), False), ((1, 32, 4096, 4096, 128), False), ((4, 8, 4096, 4096, 64), False), ((16, 16, 4096, 4096, 128), True)]
    if os.environ.get("SHORT"):  # the shapes the first branch lost at
        shapes = [((1, 32, 512, 512, 128), False), ((4, 8, 512, 512, 64), False), ((4, 8, 1024, 1024, 64), False),
                  ((1, 32, 1024, 1024, 128), False), ((1, 32, 256, 256, 128), False), ((1, 32, 2048, 2048, 128), False)] + shapes
    for dims, causal in shapes:
        shape = stage_abi.Shape(*dims, causal=causal)
        t = lambda L: torch.randn(shape.batch, shape.heads, L, shape.head_dim, device="cuda", dtype=torch.bfloat16)
        q, k, v, do = t(shape.len_q), t(shape.len_kv), t(shape.len_kv), t(shape.len_q)
        o = torch.empty_like(q); lse = torch.empty(shape.batch, shape.heads, shape.len_q, device="cuda")
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        a = [x.data_ptr() for x in (q, k, v, o, lse, do, dq, dk, dv)]
        lib.forward(*a[:5], shape)
        for _ in range(10): lib.backward(*a, shape)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(20): lib.backward(*a, shape)
            torch.cuda.synchronize()
        name = f"{out}/trace.json"
        p.export_chrome_trace(name)
        ev = [e for e in json.load(open(name))["traceEvents"] if e.get("cat") == "kernel"]
        ev.sort(key=lambda e: e["ts"])
        kinds = [("pre", "preprocess"), ("main", "flash_backward"), ("conv", "convert_dq")]
        calls, cur = [], {}
        for e in ev:
            for key, pat in kinds:
                if pat in e["name"]:
                    if key == "pre" and cur: calls.append(cur); cur = {}
                    cur[key] = (e["ts"], e["ts"] + e["dur"])
        calls.append(cur)
        calls = [c for c in calls if len(c) == 3]
        rows = collections = {}
        spans = {"pre": [], "pre_end->main_end": [], "main_end->conv_end": [], "conv_start->main_end": [], "gap to next pre": [], "call": []}
        for i, c in enumerate(calls):
            spans["pre"].append(c["pre"][1] - c["pre"][0])
            spans["pre_end->main_end"].append(c["main"][1] - c["pre"][1])
            spans["main_end->conv_end"].append(c["conv"][1] - c["main"][1])
            spans["conv_start->main_end"].append(c["main"][1] - c["conv"][0])
            if i + 1 < len(calls):
                spans["gap to next pre"].append(calls[i + 1]["pre"][0] - c["conv"][1])
                spans["call"].append(calls[i + 1]["pre"][0] - c["pre"][0])
        print(f"== {stage_name} {'x'.join(map(str, dims))}{' causal' if causal else ''}: {len(calls)} calls; medians (us): " +
              ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in spans.items() if v), flush=True)
