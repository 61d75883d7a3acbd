#!/usr/bin/env python3
"""Train a small GPT-style model with the course's attention, and again with PyTorch's.

The task needs attention to be solved: each sequence is CONTEXT/2 random tokens followed by the
same tokens again, and the loss is taken on the second half, where a model that has learned to
look back one copy earlier (an induction head) predicts every token. The model: LAYERS
pre-norm transformer blocks, HEADS heads of head dimension HEAD_DIM, causal attention, BF16
autocast. Three runs from the same code:

  course   flashcourse.attention (stage 11_hopper_backward: forward and backward), seed 0
  sdpa     torch.nn.functional.scaled_dot_product_attention, seed 0 (same weights, same data)
  sdpa-2   the same with seed 1: the spread that a change of seed alone makes

Writes OUT/log.csv (run, step, loss, seconds) and OUT/summary.txt (final losses: the mean of the
last 20 steps; training throughput in tokens/s after the first 20 steps), and with --figure
FILE the two loss curves (and sdpa-2's) in one figure.

usage: python3 python/examples/train_gpt.py --out build/train_gpt [--figure docs/img/training.png]
   (after make all, on a Hopper GPU with PyTorch)
"""
import argparse
import csv
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import flashcourse  # noqa: E402

VOCAB = 256
CONTEXT = 1024
LAYERS = 4
HEADS = 8
HEAD_DIM = 64
WIDTH = HEADS * HEAD_DIM
BATCH = 16
STEPS = 300
LEARNING_RATE = 1e-3
WARMUP_STEPS = 30
LAST = 20  # the final loss is the mean of the last LAST steps; throughput skips the first LAST
STAGE = "11_hopper_backward"


class Block(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.attention = attention
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.out = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                 nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(WIDTH, dim=-1)
        q, k, v = (t.view(batch, length, HEADS, HEAD_DIM).transpose(1, 2) for t in (q, k, v))
        heads = self.attention(q, k, v)  # [batch, heads, length, head_dim]
        x = x + self.out(heads.transpose(1, 2).reshape(batch, length, WIDTH))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.randn(CONTEXT, WIDTH) * 0.02)
        self.blocks = nn.ModuleList(Block(attention) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def course_attention(q, k, v):
    return flashcourse.attention(q, k, v, causal=True, stage=STAGE)


def sdpa_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def batch_of(generator):
    """BATCH sequences: CONTEXT/2 random tokens, then the same again."""
    half = torch.randint(0, VOCAB, (BATCH, CONTEXT // 2), device="cuda", generator=generator)
    return torch.cat([half, half], dim=1)


def train(name, attention, seed, writer):
    torch.manual_seed(seed)
    model = GPT(attention).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(
        1.0, (step + 1) / WARMUP_STEPS) * 0.5 * (1 + math.cos(math.pi * step / STEPS)))
    generator = torch.Generator(device="cuda").manual_seed(seed)
    losses, started, timed_from = [], time.perf_counter(), None
    for step in range(STEPS):
        if step == LAST:
            torch.cuda.synchronize()
            timed_from = time.perf_counter()
        tokens = batch_of(generator)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        # The loss on the second half only: the tokens a model can know.
        half = CONTEXT // 2
        loss = F.cross_entropy(logits[:, half - 1:].float().reshape(-1, VOCAB),
                               tokens[:, half:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        writer.writerow([name, step, f"{losses[-1]:.5f}", f"{time.perf_counter() - started:.3f}"])
    torch.cuda.synchronize()
    tokens_per_second = (STEPS - LAST) * BATCH * (CONTEXT - 1) / (time.perf_counter() - timed_from)
    return sum(losses[-LAST:]) / LAST, tokens_per_second, losses


def figure(curves, path, summary):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.6), dpi=130)
    styles = {"course": ("#c0392b", "-"), "sdpa": ("#1f4e79", "--"), "sdpa-2": ("#7f9fbf", ":")}
    for name, losses in curves.items():
        color, line = styles[name]
        label = {"course": f"course ({STAGE}), seed 0", "sdpa": "PyTorch SDPA, seed 0",
                 "sdpa-2": "PyTorch SDPA, seed 1"}[name]
        ax.plot(range(len(losses)), losses, line, color=color, lw=1.3, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss on the repeated half (nats)")
    ax.set_title(f"A {LAYERS}-layer GPT learning to copy ({CONTEXT} tokens, d = {HEAD_DIM})",
                 fontsize=10)
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.text(0.02, 0.02, summary, ha="left", va="bottom", fontsize=7, color="#444")
    fig.savefig(path)
    print(f"train_gpt: wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for log.csv and summary.txt")
    parser.add_argument("--figure", help="where to draw the loss curves (a .png)")
    arguments = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("train_gpt: needs a CUDA GPU")
    os.makedirs(arguments.out, exist_ok=True)
    results, curves = {}, {}
    with open(os.path.join(arguments.out, "log.csv"), "w", newline="") as log:
        writer = csv.writer(log, lineterminator="\n")
        writer.writerow(["run", "step", "loss", "seconds"])
        for name, attention, seed in (("course", course_attention, 0), ("sdpa", sdpa_attention, 0),
                                      ("sdpa-2", sdpa_attention, 1)):
            final, throughput, losses = train(name, attention, seed, writer)
            results[name], curves[name] = (final, throughput), losses
            print(f"train_gpt: {name}: final loss {final:.4f}, {throughput:,.0f} tokens/s",
                  flush=True)
    spread = abs(results["sdpa"][0] - results["sdpa-2"][0])
    gap = abs(results["course"][0] - results["sdpa"][0])
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {LAYERS} layers, "
             f"{HEADS} heads of {HEAD_DIM}, context {CONTEXT}, batch {BATCH}, {STEPS} steps",
             *(f"{name}: final loss {final:.4f} (mean of the last {LAST} steps), "
               f"{throughput:,.0f} tokens/s" for name, (final, throughput) in results.items()),
             f"course against sdpa (same seed): {gap:.4f}; sdpa against sdpa-2 (another seed): "
             f"{spread:.4f}; {'within' if gap <= spread else 'OUTSIDE'} the spread of a seed",
             f"throughput, course over sdpa: {results['course'][1] / results['sdpa'][1]:.2f}x"]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(arguments.out, "summary.txt"), "w") as out:
        out.write(text + "\n")
    if arguments.figure:
        figure(curves, arguments.figure, "\n".join(lines[1:4]))
    return 0 if gap <= spread else 1


if __name__ == "__main__":
    sys.exit(main())
