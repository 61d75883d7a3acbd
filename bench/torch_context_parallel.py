#!/usr/bin/env python3
"""PyTorch's own context parallelism, the ring's baseline: one process per GPU under torchrun,
torch.distributed's `context_parallel` around `F.scaled_dot_product_attention`, the sequence
split over the GPUs of one host, NCCL underneath. It writes rows in the ring benchmark's CSV
columns (13_ring_attention/bench_ring.cpp), `sharding` naming PyTorch's rotation
(torch_cp_allgather, torch_cp_alltoall), so that both land in one file and one figure.

    torchrun --standalone --nproc-per-node 4 bench/torch_context_parallel.py \\
        --len 262144 --heads 32 --head-dim 128 --causal 1 [--batch 1] [--repeats 3] \\
        [--rotate allgather|alltoall] [--backend cudnn|flash|efficient] [--csv FILE] [--check]

Timing follows the ring's: one warm-up call, then --repeats timed calls; each call starts after
a barrier and is timed by CUDA events on every rank; a call's time is the slowest rank's (an
all-reduce of the maximum), since a training step waits for the last GPU. The backward row
times the backward alone (its forward runs before, untimed). FLOPs follow the FlashAttention
convention (forward 4 B H N^2 D, halved when causal; backward 2.5x forward); per-GPU TFLOP/s is
FLOPs / GPUs / median time. --check first runs a small shape (B=1, H=2, N=1024 * GPUs, the
given head dim and mask) and compares the output and the input gradients with one-GPU SDPA on
rank 0, and stops with an error if they differ by more than 2e-2 (relative L2, bf16).

The API is experimental and has moved between PyTorch versions; where this version lacks it, the
script writes a row whose status says so instead of a time, and exits 0.
"""

import argparse
import os
import statistics
import sys


def parse():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--len", type=int, required=True, help="tokens of the whole sequence")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rotate", choices=["allgather", "alltoall"], default="allgather")
    parser.add_argument("--backend", choices=["cudnn", "flash", "efficient"], default="cudnn")
    parser.add_argument("--pass", dest="pass_name", choices=["fwd", "bwd", "both"], default="both")
    parser.add_argument("--csv", help="append the rows here (rank 0); else print them")
    parser.add_argument("--check", action="store_true")
    return parser.parse_args()


def context_parallel_api():
    """(context_parallel, set_rotate_method, context_parallel_unshard or None, options), or a
    reason. `options` is torch's _cp_options, whose enable_load_balance the non-causal case turns
    off (torch balances by head and tail halves, for the causal mask only)."""
    try:
        from torch.distributed.tensor.experimental import context_parallel
    except ImportError as error:
        return None, f"no torch.distributed.tensor.experimental.context_parallel ({error})"
    try:
        from torch.distributed.tensor.experimental import _attention as private
        set_rotate_method, options = private.set_rotate_method, private._cp_options
    except (ImportError, AttributeError) as error:
        return None, f"no set_rotate_method or _cp_options ({error})"
    # context_parallel_unshard: public in some versions, in _attention only in others (2.11).
    context_parallel_unshard = getattr(private, "context_parallel_unshard", None)
    try:
        from torch.distributed.tensor.experimental import context_parallel_unshard
    except ImportError:
        pass
    return (context_parallel, set_rotate_method, context_parallel_unshard, options), None


def flops(arguments, pass_name):
    forward = 4.0 * arguments.batch * arguments.heads * arguments.len ** 2 * arguments.head_dim
    if arguments.causal:
        forward /= 2
    return forward * (2.5 if pass_name == "bwd" else 1.0)


def main():
    arguments = parse()
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (world,))
    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}[arguments.backend]
    gpu = torch.cuda.get_device_name()
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    sharding = f"torch_cp_{arguments.rotate}"

    def row(pass_name, median_ms="", min_ms="", tflops="", status="ok"):
        return ",".join(map(str, [gpu, world, sharding, arguments.batch, arguments.heads,
                                  arguments.len, arguments.head_dim, arguments.causal, pass_name,
                                  median_ms, min_ms, tflops, "", "", "", "", "",
                                  f"{nccl} (torch {torch.__version__})", status]))

    def emit(lines):
        if rank != 0:
            return
        if arguments.csv:
            with open(arguments.csv, "a") as out:
                out.write("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)

    passes = ["fwd", "bwd"] if arguments.pass_name == "both" else [arguments.pass_name]
    api, missing = context_parallel_api()
    if api is None:
        emit([row(p, status=f"skipped: {missing}") for p in passes])
        dist.destroy_process_group()
        return 0
    context_parallel, set_rotate_method, unshard, options = api
    set_rotate_method(arguments.rotate)
    options.enable_load_balance = bool(arguments.causal)  # torch refuses it without the mask

    def inputs(batch, heads, length, seed):
        generator = torch.Generator(device="cuda").manual_seed(seed)  # the same on every rank
        shape = (batch, heads, length, arguments.head_dim)
        return [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
                for _ in range(4)]  # q, k, v, dO

    def run(buffers, causal, backward):
        """One call inside the context: the buffers are this rank's shards there."""
        q, k, v, d_out = buffers
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2, 2],
                              no_restore_buffers=set(buffers)), sdpa_kernel(backend):
            leaves = [t.detach().requires_grad_(backward) for t in (q, k, v)]
            out = F.scaled_dot_product_attention(*leaves, is_causal=bool(causal))
            if backward:
                out.backward(d_out)
            return out, leaves

    if arguments.check:
        length = 1024 * world
        full = inputs(1, 2, length, seed=7)
        reference = [t.clone() for t in full]
        out, leaves = run([t.clone() for t in full], arguments.causal, True)
        if unshard is None:
            if rank == 0:
                print("check: not run (this PyTorch has no context_parallel_unshard to gather the "
                      "output)", flush=True)
        else:
            gathered = unshard(mesh, [out.detach()] + [t.grad for t in leaves], [2, 2, 2, 2])
            if rank == 0:
                q, k, v, d_out = [t.detach().requires_grad_(i < 3) for i, t in enumerate(reference)]
                with sdpa_kernel(backend):
                    expected = F.scaled_dot_product_attention(q, k, v, is_causal=bool(arguments.causal))
                expected.backward(d_out)
                for name, got, want in zip(["O", "dQ", "dK", "dV"], gathered,
                                           [expected, q.grad, k.grad, v.grad]):
                    error = ((got.float() - want.float()).norm() / want.float().norm()).item()
                    print(f"check {name}: relative L2 {error:.2e}", flush=True)
                    if not error <= 2e-2:
                        raise SystemExit(f"torch_context_parallel: {name} differs from one-GPU SDPA "
                                         f"by {error:.2e} (relative L2)")
        dist.barrier()

    lines = []
    for pass_name in passes:
        backward = pass_name == "bwd"
        times = []
        for call in range(arguments.repeats + 1):  # the first is the warm-up
            buffers = inputs(arguments.batch, arguments.heads, arguments.len, seed=call)
            q, k, v, d_out = buffers
            # Entering the context shards the buffers in place (load-balanced for causal): input
            # preparation, not attention, so it stays outside the timed span.
            with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2, 2],
                                  no_restore_buffers=set(buffers)), sdpa_kernel(backend):
                leaves = [t.detach().requires_grad_(backward) for t in (q, k, v)]
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                if backward:
                    out = F.scaled_dot_product_attention(*leaves, is_causal=bool(arguments.causal))
                torch.cuda.synchronize()
                dist.barrier()
                start.record()
                if backward:
                    out.backward(d_out)
                else:
                    F.scaled_dot_product_attention(*leaves, is_causal=bool(arguments.causal))
                end.record()
                torch.cuda.synchronize()
            elapsed = torch.tensor([start.elapsed_time(end)], device="cuda")
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if call > 0:
                times.append(elapsed.item())
            del buffers, q, k, v, d_out, leaves
        median = statistics.median(times)
        tflops = flops(arguments, pass_name) / world / (median * 1e-3) / 1e12
        lines.append(row(pass_name, f"{median:.4f}", f"{min(times):.4f}", f"{tflops:.2f}"))
    emit(lines)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
