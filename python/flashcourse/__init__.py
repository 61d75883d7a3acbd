"""Every stage of the course on PyTorch tensors.

    import flashcourse                                    # with python/ on sys.path
    o = flashcourse.attention(q, k, v, causal=True, stage="11_hopper_backward")
    o.sum().backward()                                    # through the stage's own backward

q, k, v: [batch, heads, len, head_dim] CUDA tensors of the stage's element type (float32 for
stages 00-04, bfloat16 from 05 on); k and v have the same length, which may differ from q's.
Inputs that are not contiguous are copied into contiguous tensors first. The result is O, with
the natural-log sum-exp of each query row as well when return_lse=True (float32,
[batch, heads, len_q]; no gradient flows through it).

The calls go through each stage's C ABI library (common/attention_c.h, loaded by
common/stage_abi.py), which `make` builds into build/<stage>/libattention_<stage>.so. They are
registered as PyTorch operators (torch.library.custom_op: flashcourse::forward and
flashcourse::backward) with shape functions, so torch.compile(fullgraph=True) traces them
without a graph break, and with an autograd formula that calls the stage's backward. A stage
without a backward (all but 07_backward and 11_hopper_backward) raises on .backward().

Bad input raises before anything runs: TypeError for what is not a tensor of the stage's element
type, ValueError for the rest (wrong device, rank or shape, and whatever the stage's own checks
refuse, with the stage's message: an unsupported head_dim, a length beyond its limit).
"""

import functools
import os
import sys
from typing import Optional, Tuple

import torch

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_REPO, "common"))
import stage_abi  # noqa: E402  (common/stage_abi.py: the one ctypes binding of the C ABI)

__all__ = ["attention", "capabilities", "stages", "DEFAULT_STAGE"]

# The default needs a backward for training: stage 11, the fastest backward, whose forward is
# stage 10's. 12_persistent runs that forward on a persistent grid and has no backward.
DEFAULT_STAGE = "11_hopper_backward"
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def stages():
    """The stage folders of the course, in order (the top-level Makefile's STAGES)."""
    sys.path.insert(0, os.path.join(_REPO, "bench"))
    from schema import STAGES
    return list(STAGES)


@functools.lru_cache(maxsize=None)
def _library(stage: str) -> stage_abi.Stage:
    return stage_abi.load(stage, _REPO)


def capabilities(stage: str = DEFAULT_STAGE) -> stage_abi.Capabilities:
    """What a stage supports: element type, head dims, longest lengths, causal, backward."""
    return _library(stage).capabilities


def _shape(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float) -> stage_abi.Shape:
    batch, heads, len_q, head_dim = q.shape
    return stage_abi.Shape(batch, heads, len_q, k.shape[2], head_dim, causal, scale)


def _stream(tensor: torch.Tensor) -> int:
    return torch.cuda.current_stream(tensor.device).cuda_stream


# ---- the operators ----------------------------------------------------------------------------

@torch.library.custom_op("flashcourse::forward", mutates_args=())
def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
             stage: str) -> Tuple[torch.Tensor, torch.Tensor]:
    _check(stage, q=q, k=k, v=v)
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    with torch.cuda.device(q.device):
        _library(stage).forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                lse.data_ptr(), _shape(q, k, causal, scale), _stream(q))
    return o, lse


@_forward.register_fake
def _(q, k, v, causal, scale, stage):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("flashcourse::backward", mutates_args=())
def _backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
              lse: torch.Tensor, dout: torch.Tensor, causal: bool, scale: float,
              stage: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check(stage, q=q, k=k, v=v, dout=dout)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    with torch.cuda.device(q.device):
        _library(stage).backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                 lse.data_ptr(), dout.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                                 dv.data_ptr(), _shape(q, k, causal, scale), _stream(q))
    return dq, dk, dv


@_backward.register_fake
def _(q, k, v, o, lse, dout, causal, scale, stage):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, stage = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale, ctx.stage = causal, scale, stage
    ctx.mark_non_differentiable(lse)


def _gradients(ctx, grad_o, grad_lse):
    if not capabilities(ctx.stage).backward:
        with_backward = [s for s in stages() if _has_backward(s)]
        raise RuntimeError(f"flashcourse: {ctx.stage} has no backward pass; the stages with one "
                           f"are {', '.join(with_backward)}")
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _backward(q, k, v, o, lse, grad_o.contiguous(), ctx.causal, ctx.scale,
                           ctx.stage)
    return dq, dk, dv, None, None, None


torch.library.register_autograd("flashcourse::forward", _gradients, setup_context=_setup_context)


def _has_backward(stage: str) -> bool:
    try:
        return capabilities(stage).backward
    except (OSError, RuntimeError):  # not built
        return False


# ---- the checks and the function --------------------------------------------------------------

def _check(stage: str, **tensors: torch.Tensor) -> None:
    """What the C ABI cannot see (element type, device, rank, matching shapes), checked before
    any launch; the stage's library checks the rest (head_dim, lengths, alignment) itself."""
    caps = capabilities(stage)
    dtype = _DTYPES[caps.dtype]
    for name, tensor in tensors.items():
        if tensor.dtype != dtype:
            raise TypeError(f"flashcourse: {name} is {tensor.dtype}; {stage} takes {dtype}")
        if tensor.device.type != "cuda":
            raise ValueError(f"flashcourse: {name} is on {tensor.device}; the stages run on a "
                             "CUDA device")
        if tensor.dim() != 4:
            raise ValueError(f"flashcourse: {name} has {tensor.dim()} dimensions; expected 4, "
                             "[batch, heads, len, head_dim]")
    q, k, v = tensors["q"], tensors["k"], tensors["v"]
    if len({tensor.device for tensor in tensors.values()}) != 1:
        raise ValueError("flashcourse: " + ", ".join(f"{n} is on {t.device}"
                                                     for n, t in tensors.items())
                         + "; expected one device")
    if k.shape != v.shape:
        raise ValueError(f"flashcourse: k is {tuple(k.shape)} and v {tuple(v.shape)}; expected "
                         "the same shape")
    if (q.shape[0], q.shape[1], q.shape[3]) != (k.shape[0], k.shape[1], k.shape[3]):
        raise ValueError(f"flashcourse: q is {tuple(q.shape)} and k {tuple(k.shape)}; expected "
                         "the same batch, heads and head_dim")
    if "dout" in tensors and tensors["dout"].shape != q.shape:
        raise ValueError(f"flashcourse: the gradient of O is {tuple(tensors['dout'].shape)}; "
                         f"expected q's shape {tuple(q.shape)}")
    if caps.compute_capability:
        major, minor = torch.cuda.get_device_capability(q.device)
        if major * 10 + minor != caps.compute_capability:
            raise ValueError(f"flashcourse: {stage} needs a GPU of compute capability "
                             f"{caps.compute_capability / 10:.1f}; {q.device} is {major}.{minor}")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: Optional[float] = None, stage: str = DEFAULT_STAGE,
              return_lse: bool = False):
    """softmax(scale * Q K^T, masked top-left when causal) V by one stage of the course.

    scale defaults to 1/sqrt(head_dim). Returns O, or (O, lse) with return_lse=True. Nothing
    here but the call itself, so that torch.compile traces it whole: the checks run inside the
    operator."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"flashcourse: {name} must be a torch.Tensor, got "
                            f"{type(tensor).__name__}")
    # scale 0 asks the stage for 1/sqrt(head_dim) (the C ABI's convention).
    o, lse = _forward(q.contiguous(), k.contiguous(), v.contiguous(), bool(causal),
                      0.0 if scale is None else float(scale), stage)
    return (o, lse) if return_lse else o
