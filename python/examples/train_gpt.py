#!/usr/bin/env python3
"""Train a small GPT-style model with the course's attention, and again with PyTorch's.

The model reads the course's own text, byte by byte (every Markdown file of the repository,
joined in path order: about 650 KB), and learns to predict the next byte: LAYERS pre-norm
transformer blocks, HEADS heads of head dimension HEAD_DIM, causal attention over CONTEXT bytes,
BF16 autocast. Four runs from the same code:

  course     flashcourse.attention (stage 11_hopper_backward: forward and backward), seed 0
  sdpa       torch.nn.functional.scaled_dot_product_attention, seed 0 (same weights, same data)
  sdpa-2     the same with seed 1: the spread that a change of seed alone makes
  no-mixing  each position attends to itself alone (the attention output is V): what the
             model learns without looking back, so the gap to the others is attention's work

The run passes when the course's curve stays with SDPA's from the same seed (the final losses
closer than the two seeds' are) and both end well below no-mixing's. Writes OUT/log.csv (run,
step, loss, seconds) and OUT/summary.txt (final losses: the mean of the last LAST steps;
training throughput in tokens/s after the first LAST steps), and with --figure FILE the four
loss curves in one figure.

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

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = 256  # bytes
CONTEXT = 1024
LAYERS = 4
HEADS = 8
HEAD_DIM = 64
WIDTH = HEADS * HEAD_DIM
BATCH = 16
STEPS = 400
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


def no_mixing_attention(q, k, v):
    return v  # each position attends to itself alone


def read_corpus():
    """Every Markdown file of the repository (outside build/ and hidden folders), joined in path
    order, as a tensor of bytes on the GPU."""
    paths = []
    for folder, subfolders, files in os.walk(REPO):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d != "build"]
        paths += [os.path.join(folder, f) for f in files if f.endswith(".md")]
    data = b"".join(open(path, "rb").read() for path in sorted(paths))
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to("cuda", torch.long)


def batch_of(corpus, generator):
    """BATCH windows of CONTEXT + 1 bytes from random places in the corpus."""
    starts = torch.randint(0, corpus.numel() - CONTEXT - 1, (BATCH, 1), device=corpus.device,
                           generator=generator)
    return corpus[starts + torch.arange(CONTEXT + 1, device=corpus.device)]


def train(name, attention, seed, corpus, writer):
    torch.manual_seed(seed)
    model = GPT(attention).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(
        1.0, (step + 1) / WARMUP_STEPS) * 0.5 * (1 + math.cos(math.pi * step / STEPS)))
    generator = torch.Generator(device=corpus.device).manual_seed(seed)
    losses, started, timed_from = [], time.perf_counter(), None
    for step in range(STEPS):
        if step == LAST:
            torch.cuda.synchronize()
            timed_from = time.perf_counter()
        tokens = batch_of(corpus, generator)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        writer.writerow([name, step, f"{losses[-1]:.5f}", f"{time.perf_counter() - started:.3f}"])
    torch.cuda.synchronize()
    tokens_per_second = (STEPS - LAST) * BATCH * CONTEXT / (time.perf_counter() - timed_from)
    return sum(losses[-LAST:]) / LAST, tokens_per_second, losses


def figure(curves, path, summary):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.6), dpi=130)
    styles = {"course": ("#c0392b", "-"), "sdpa": ("#1f4e79", "--"), "sdpa-2": ("#7f9fbf", ":"),
              "no-mixing": ("#888888", "-.")}
    labels = {"course": f"course ({STAGE}), seed 0", "sdpa": "PyTorch SDPA, seed 0",
              "sdpa-2": "PyTorch SDPA, seed 1", "no-mixing": "no attention (V alone), seed 0"}
    for name, losses in curves.items():
        color, line = styles[name]
        ax.plot(range(len(losses)), losses, line, color=color, lw=1.3, label=labels[name])
    ax.set_ylim(top=min(4.0, max(max(c) for c in curves.values())))
    ax.set_xlabel("step")
    ax.set_ylabel("next-byte loss (nats)")
    ax.set_title(f"A {LAYERS}-layer GPT reading the course's own text ({CONTEXT} bytes of "
                 f"context, d = {HEAD_DIM})", fontsize=10)
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0.17, 1, 1))
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
        corpus = read_corpus()
        for name, attention, seed in (("course", course_attention, 0), ("sdpa", sdpa_attention, 0),
                                      ("sdpa-2", sdpa_attention, 1),
                                      ("no-mixing", no_mixing_attention, 0)):
            final, throughput, losses = train(name, attention, seed, corpus, writer)
            results[name], curves[name] = (final, throughput), losses
            print(f"train_gpt: {name}: final loss {final:.4f}, {throughput:,.0f} tokens/s",
                  flush=True)
    def apart(a, b):  # the mean |difference| of two runs' losses over the last LAST steps
        return sum(abs(x - y) for x, y in zip(curves[a][-LAST:], curves[b][-LAST:])) / LAST
    spread, gap = apart("sdpa", "sdpa-2"), apart("course", "sdpa")
    attention_gain = results["no-mixing"][0] - max(results["course"][0], results["sdpa"][0])
    passed = gap <= spread and attention_gain > max(spread, 0.1)
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {LAYERS} layers, "
             f"{HEADS} heads of {HEAD_DIM}, context {CONTEXT}, batch {BATCH}, {STEPS} steps; "
             f"{corpus.numel():,} bytes of Markdown",
             *(f"{name}: final loss {final:.4f} (mean of the last {LAST} steps), "
               f"{throughput:,.0f} tokens/s" for name, (final, throughput) in results.items()),
             f"step by step over the last {LAST} steps, course against sdpa (same seed) "
             f"{gap:.4f} apart, sdpa against sdpa-2 (another seed) {spread:.4f}: "
             f"{'within' if gap <= spread else 'OUTSIDE'} the spread of a seed",
             f"what attention buys: no-mixing ends {attention_gain:.3f} above the worse of course "
             f"and sdpa ({'more' if attention_gain > max(spread, 0.1) else 'NOT more'} than "
             f"that spread and 0.1)",
             f"throughput, course over sdpa: {results['course'][1] / results['sdpa'][1]:.2f}x"]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(arguments.out, "summary.txt"), "w") as out:
        out.write(text + "\n")
    if arguments.figure:
        figure(curves, arguments.figure, "\n".join(lines[1:5]))
    print("train_gpt: " + ("passed" if passed else "FAILED"))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
