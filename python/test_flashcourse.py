#!/usr/bin/env python3
"""Tests of the PyTorch package (python/flashcourse): every stage against PyTorch's
scaled_dot_product_attention, the gradients of the stages with a backward, torch.compile, and
each class of bad input.

The criterion is FlashAttention-2's: against a float64 reference, a stage's largest error may be
at most twice that of PyTorch's own attention in the stage's element type, plus a small floor
(ATOL) for outputs that come out exact. Run by `make test` (the summary line it writes,
build/python/test-summary.txt, is counted with the stages'): without PyTorch every case is
reported skipped, by name; without a CUDA GPU (or without the GPU a stage needs) its GPU cases
are.

usage: python3 python/test_flashcourse.py [-v] [unittest arguments]
"""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "bench"))
from schema import STAGES  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
    import flashcourse
    WHY_NOT = ""
except ImportError as error:  # no PyTorch: every case is skipped, by name
    torch = None
    WHY_NOT = f"PyTorch is not importable ({error})"

ATOL = 1e-5
BACKWARD_STAGES = ["07_backward", "11_hopper_backward"]
# (batch, heads, len_q, len_kv, head_dim, causal): odd lengths, len_q != len_kv both ways,
# causal with more keys than queries and the other way round, both head dims.
SHAPES = [(1, 1, 1, 1, 64, False), (2, 3, 77, 100, 64, True), (1, 2, 130, 65, 64, False),
          (2, 2, 100, 77, 128, True), (1, 4, 256, 512, 128, False), (1, 2, 333, 333, 64, True)]


def gpu_problem(stage):
    """Why this stage's GPU cases cannot run here, or ""."""
    if WHY_NOT:
        return WHY_NOT
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to PyTorch"
    try:
        caps = flashcourse.capabilities(stage)
    except (OSError, RuntimeError) as error:
        return f"{stage}'s library is not built ({error}): make all"
    if caps.compute_capability:
        major, minor = torch.cuda.get_device_capability()
        if major * 10 + minor != caps.compute_capability:
            return (f"{stage} needs compute capability {caps.compute_capability / 10:.1f}, "
                    f"this GPU is {major}.{minor}")
    return ""


def inputs(stage, shape, requires_grad=False, seed=0):
    batch, heads, len_q, len_kv, head_dim, _ = shape
    dtype = torch.float32 if flashcourse.capabilities(stage).dtype == "fp32" else torch.bfloat16
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def tensor(length):
        values = torch.randn(batch, heads, length, head_dim, device="cuda", dtype=torch.float32,
                             generator=generator)
        return values.to(dtype).requires_grad_(requires_grad)
    return tensor(len_q), tensor(len_kv), tensor(len_kv)


def reference(q, k, v, causal, dtype=None):
    """SDPA in dtype (None, float64: the reference; the inputs' type: PyTorch's own error), on
    copies that carry their own gradients."""
    dtype = dtype or torch.float64
    copies = [t.detach().to(dtype).requires_grad_(t.requires_grad) for t in (q, k, v)]
    return F.scaled_dot_product_attention(*copies, is_causal=causal), copies


def within(case, name, value, exact, pytorch):
    """FlashAttention-2's criterion, with the numbers in the message."""
    error = (value.double() - exact).abs().max().item()
    bound = 2 * (pytorch.double() - exact).abs().max().item() + ATOL
    case.assertLessEqual(error, bound, f"{name}: error {error:.3g} against the float64 "
                                       f"reference, PyTorch's {bound / 2:.3g}")


def check_forward(case, stage, shape):
    """O and LSE of one forward call against the float64 reference."""
    q, k, v = inputs(stage, shape)
    o, lse = flashcourse.attention(q, k, v, causal=shape[5], stage=stage, return_lse=True)
    exact, copies = reference(q, k, v, shape[5])
    pytorch, _ = reference(q, k, v, shape[5], dtype=q.dtype)
    within(case, "O", o, exact, pytorch)
    scores = torch.matmul(copies[0], copies[1].transpose(-2, -1)) / shape[4] ** 0.5
    if shape[5]:
        hidden = torch.ones(shape[2], shape[3], dtype=torch.bool, device="cuda").triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    exact_lse = torch.logsumexp(scores, dim=-1)
    case.assertLessEqual((lse.double() - exact_lse).abs().max().item(), 1e-3,
                         "lse against the float64 log-sum-exp")


def skip_unless(problem):
    return unittest.skipIf(bool(problem), problem)


def add_stage_cases():
    """One case per stage and shape, and per backward stage and shape; without PyTorch or a
    GPU the same cases, skipped with the reason."""
    for stage in STAGES:
        problem = gpu_problem(stage)
        for shape in SHAPES:
            tag = "x".join(str(int(f)) for f in shape)
            def forward(self, stage=stage, shape=shape):
                caps = flashcourse.capabilities(stage)
                if shape[4] not in caps.head_dims or (shape[5] and not caps.causal):
                    self.skipTest(f"{stage} does not support head_dim {shape[4]}"
                                  f"{' with causal' if shape[5] else ''}")
                check_forward(self, stage, shape)
            setattr(StageCases, f"test_{stage}_forward_{tag}", skip_unless(problem)(forward))
            if stage not in BACKWARD_STAGES:
                continue

            def gradients(self, stage=stage, shape=shape):
                if shape[4] not in flashcourse.capabilities(stage).head_dims:
                    self.skipTest(f"{stage} does not support head_dim {shape[4]}")
                q, k, v = inputs(stage, shape, requires_grad=True)
                dout = torch.randn_like(q)
                o = flashcourse.attention(q, k, v, causal=shape[5], stage=stage)
                mine = torch.autograd.grad(o, (q, k, v), dout)
                exact_o, exact_in = reference(q, k, v, shape[5])
                exact = torch.autograd.grad(exact_o, exact_in, dout.double())
                pytorch_o, pytorch_in = reference(q, k, v, shape[5], dtype=q.dtype)
                pytorch = torch.autograd.grad(pytorch_o, pytorch_in, dout)
                for name, a, b, c in zip(("dQ", "dK", "dV"), mine, exact, pytorch):
                    within(self, name, a, b, c)
            setattr(StageCases, f"test_{stage}_gradients_{tag}", skip_unless(problem)(gradients))


class StageCases(unittest.TestCase):
    """Filled in by add_stage_cases: one case per stage and shape, and per backward stage and
    shape."""


def needs(stage):
    return skip_unless(gpu_problem(stage) if torch is not None else WHY_NOT)


class Compiled(unittest.TestCase):
    @needs("11_hopper_backward")
    def test_compiled_forward_and_backward_match_eager(self):
        stage, shape = "11_hopper_backward", (2, 2, 100, 77, 128, True)

        def layer(q, k, v):
            return flashcourse.attention(q, k, v, causal=True, stage=stage) * 2.0

        compiled = torch.compile(layer, fullgraph=True)
        q, k, v = inputs(stage, shape, requires_grad=True)
        eager_o = layer(q, k, v)
        eager_grads = torch.autograd.grad(eager_o.sum(), (q, k, v))
        compiled_o = compiled(q, k, v)
        compiled_grads = torch.autograd.grad(compiled_o.sum(), (q, k, v))
        self.assertTrue(torch.equal(eager_o, compiled_o))
        for eager, traced in zip(eager_grads, compiled_grads):
            self.assertTrue(torch.equal(eager, traced))


class Persistent(unittest.TestCase):
    """Stage 12 with more work tiles than the GPU has SMs (SHAPES all fit in one wave): every
    block walks several work tiles, and the causal calls take theirs from the tile counter."""

    @needs("12_persistent")
    def test_several_work_tiles_per_block(self):
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        for head_dim in (64, 128):
            for causal in (False, True):
                # 200 rows are two query tiles (128 or 192 rows each): four work tiles per SM.
                with self.subTest(head_dim=head_dim, causal=causal):
                    check_forward(self, "12_persistent", (1, 2 * sms, 200, 130, head_dim, causal))


class BadInput(unittest.TestCase):
    stage = "10_pingpong"

    def good(self, **changes):
        shape = (1, 2, 64, 64, 128, False)
        q, k, v = inputs(self.stage, shape)
        return {"q": q, "k": k, "v": v, **changes}

    def refused(self, error, text, **changes):
        with self.assertRaisesRegex(error, text):
            flashcourse.attention(stage=self.stage, **self.good(**changes))

    @needs("10_pingpong")
    def test_the_wrong_element_type(self):
        self.refused(TypeError, "q is torch.float16; 10_pingpong takes torch.bfloat16",
                     q=torch.zeros(1, 2, 64, 128, device="cuda", dtype=torch.float16))

    @needs("10_pingpong")
    def test_a_tensor_on_the_cpu(self):
        self.refused(ValueError, "k is on cpu",
                     k=torch.zeros(1, 2, 64, 128, dtype=torch.bfloat16))

    @needs("10_pingpong")
    def test_three_dimensions(self):
        self.refused(ValueError, "v has 3 dimensions",
                     v=torch.zeros(2, 64, 128, device="cuda", dtype=torch.bfloat16))

    @needs("10_pingpong")
    def test_k_and_v_of_different_lengths(self):
        self.refused(ValueError, "expected the same shape",
                     v=torch.zeros(1, 2, 65, 128, device="cuda", dtype=torch.bfloat16))

    @needs("10_pingpong")
    def test_an_unsupported_head_dim_with_the_stage_message(self):
        odd = torch.zeros(1, 2, 64, 96, device="cuda", dtype=torch.bfloat16)
        self.refused(ValueError, "head_dim", q=odd, k=odd, v=odd)

    @needs("10_pingpong")
    def test_not_a_tensor(self):
        self.refused(TypeError, "q must be a torch.Tensor", q=[[1.0]])

    @needs("10_pingpong")
    def test_a_non_contiguous_input_is_copied(self):
        q, k, v = inputs(self.stage, (1, 2, 64, 64, 128, False))
        wide = torch.zeros(1, 2, 64, 256, device="cuda", dtype=torch.bfloat16)
        wide[..., :128] = q
        strided = wide[..., :128]
        self.assertFalse(strided.is_contiguous())
        self.assertTrue(torch.equal(flashcourse.attention(strided, k, v, stage=self.stage),
                                    flashcourse.attention(q, k, v, stage=self.stage)))

    @needs("10_pingpong")
    def test_backward_through_a_stage_without_one(self):
        q, k, v = inputs(self.stage, (1, 2, 64, 64, 128, False), requires_grad=True)
        o = flashcourse.attention(q, k, v, stage=self.stage)
        with self.assertRaisesRegex(RuntimeError, "10_pingpong has no backward pass"):
            o.sum().backward()


def main():
    add_stage_cases()
    program = unittest.main(exit=False, verbosity=1)
    result = program.result
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped
    line = f"python: {passed} passed, {failed} failed, {skipped} skipped"
    summary = os.environ.get("TEST_SUMMARY_FILE")
    if summary:
        os.makedirs(os.path.dirname(summary), exist_ok=True)
        with open(summary, "w") as out:
            out.write(line + "\n")
    print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
