#!/usr/bin/env python3
"""Checks that a backward stage carries its forward stage's forward pass verbatim.

Stage 11 computes O and LSE with stage 10's kernels: the code between

    // ---- forward: begin ...
    // ---- forward: end ...

in 11_hopper_backward/attention.cu must equal stage 10's file from `using bf16 = ...` to the end
of its anonymous namespace, and both files' attention_forward() must be the same function.
Excerpt markers (`// excerpt: NAME`, `// end excerpt`, for the chapters) are not compared: a
chapter shows its own stage's excerpts, so the copy carries none.
Exits 1 and prints a diff when they differ.

usage: bench/check_forward_copy.py [FORWARD_STAGE BACKWARD_STAGE]   (default: 10_pingpong 11_hopper_backward)
"""
import difflib
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def between(text, start, end, path):
    begin = text.find(start)
    finish = text.find(end, begin + 1)
    if begin < 0 or finish < 0:
        raise SystemExit(f"{path}: cannot find '{start.strip()}' ... '{end.strip()}'")
    return text[begin:finish]


MARKER = re.compile(r"^\s*// (excerpt: \S+|end excerpt)\s*\n", re.M)


def without_markers(text):
    return MARKER.sub("", text)


def public_forward(text, path):
    match = re.search(r"^void attention_forward\(.*?^}\n", text, re.S | re.M)
    if not match:
        raise SystemExit(f"{path}: no attention_forward definition")
    return match.group(0)


def main():
    forward_stage, backward_stage = sys.argv[1:3] if len(sys.argv) == 3 else ("10_pingpong", "11_hopper_backward")
    forward_path = os.path.join(ROOT, forward_stage, "attention.cu")
    backward_path = os.path.join(ROOT, backward_stage, "attention.cu")
    forward = without_markers(open(forward_path).read())
    backward = open(backward_path).read()
    pairs = [
        (between(forward, "using bf16 = __nv_bfloat16;\n", "}  // namespace\n", forward_path),
         between(backward, "using bf16 = __nv_bfloat16;\n", "// ---- forward: end", backward_path)),
        (public_forward(forward, forward_path), public_forward(backward, backward_path)),
    ]
    stale = False
    for original, copy in pairs:
        if original != copy:
            stale = True
            sys.stdout.writelines(difflib.unified_diff(
                original.splitlines(True), copy.splitlines(True),
                f"{forward_stage}/attention.cu", f"{backward_stage}/attention.cu"))
    if stale:
        print(f"{backward_stage}'s forward differs from {forward_stage}'s: copy it again.")
        return 1
    print(f"{backward_stage} carries {forward_stage}'s forward verbatim")
    return 0


if __name__ == "__main__":
    sys.exit(main())
