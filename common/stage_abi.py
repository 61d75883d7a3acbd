"""Load a stage's shared library and call its C ABI (common/attention_c.h) from Python.

Standard library only (ctypes): no PyTorch, no NumPy. `make` builds one library per suite,
build/<STAGE>/libattention_<STAGE>.so; load() finds it, checks its ABI version and wraps the
calls. Pointers are integer device addresses (0 for a null lse), e.g. a torch tensor's
.data_ptr(); stream is a cudaStream_t as an integer (0: the legacy default stream), e.g.
torch.cuda.current_stream().cuda_stream. A refusal raises ValueError (ATTENTION_C_INVALID_ARGUMENT)
and a CUDA failure RuntimeError (ATTENTION_C_RUNTIME_ERROR), with the library's message.

    import stage_abi                                 # with common/ on sys.path
    stage = stage_abi.load("07_backward")            # or "07", "bench/cublas_bf16", a .so path
    shape = stage_abi.Shape(batch=1, heads=8, len_q=4096, len_kv=4096, head_dim=128, causal=True)
    print(stage.capabilities.head_dims, stage.workspace_bytes(shape))
    stage.forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), shape)

A bit-identical backward, where the stage has one (capabilities.deterministic_backward; a stage
without it refuses the shape with ValueError):

    fixed = dataclasses.replace(shape, deterministic=True)
    stage.backward(*(t.data_ptr() for t in (q, k, v, o, lse, dout, dq, dk, dv)), fixed)

A caller that splits a row's keys over several calls and sums their dQ (ring attention) gives
every call the same centre of the centred dQ, the mean of all the keys, as an FP32
[batch * heads, head_dim] device tensor (capabilities.key_centre_backward; a stage without it
refuses one with ValueError; attention_backward in common/attention.h says why):

    stage.backward(*(t.data_ptr() for t in (q, k, v, o, lse, dout, dq, dk, dv)), shape,
                   key_centre=centre.data_ptr())

Several stages' libraries can be loaded into one process at once (each binds its own code and
exports only the C ABI); each Stage object calls its own library.
"""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple, Union

# ATTENTION_C_ABI_VERSION of the header these ctypes structures mirror.
ABI_VERSION = 3
OK, INVALID_ARGUMENT, RUNTIME_ERROR = 0, 1, 2

# The repository root: this file lives in common/.
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Shape:
    """AttentionCShape: [batch, heads, len, head_dim] tensors; scale 0 is 1/sqrt(head_dim).
    deterministic: bit-identical dQ, dK, dV run to run; only the backward reads it (every
    forward is deterministic), and a stage without capabilities.deterministic_backward refuses
    it there."""

    batch: int
    heads: int
    len_q: int
    len_kv: int
    head_dim: int
    causal: bool = False
    scale: float = 0.0
    deterministic: bool = False


@dataclass(frozen=True)
class Capabilities:
    """AttentionCCapabilities: what the stage supports (StageCapabilities in attention.h)."""

    name: str                 # the suite's name, e.g. "03_online_softmax", "cublas_bf16"
    dtype: str                # "fp32" (float elements) or "bf16" (bfloat16 elements)
    head_dims: Tuple[int, ...]
    max_len_q: int            # every len_q in [1, max_len_q] is supported
    max_len_kv: int
    causal: bool
    backward: bool
    alignment_bytes: int      # q, k, v, o (and dout, dq, dk, dv) must be aligned to this
    compute_capability: int   # 0: any GPU the build targets; 90: Hopper only
    deterministic_backward: bool = False  # the backward honours Shape.deterministic
    key_centre_backward: bool = False     # the backward takes a key_centre

    @property
    def element_bytes(self) -> int:
        return 4 if self.dtype == "fp32" else 2


class _CShape(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int), ("heads", ctypes.c_int), ("len_q", ctypes.c_int),
                ("len_kv", ctypes.c_int), ("head_dim", ctypes.c_int), ("causal", ctypes.c_int),
                ("scale", ctypes.c_float), ("deterministic", ctypes.c_int)]


class _CCapabilities(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 64), ("dtype", ctypes.c_char * 8),
                ("head_dims", ctypes.c_int * 8), ("head_dim_count", ctypes.c_int),
                ("max_len_q", ctypes.c_int), ("max_len_kv", ctypes.c_int),
                ("causal", ctypes.c_int), ("backward", ctypes.c_int),
                ("alignment_bytes", ctypes.c_int), ("compute_capability", ctypes.c_int),
                ("deterministic_backward", ctypes.c_int), ("key_centre_backward", ctypes.c_int)]


ShapeLike = Union[Shape, tuple]
Pointer = Optional[int]


def stage_name(stage: Union[str, os.PathLike], root: Union[str, os.PathLike] = ROOT) -> str:
    """The suite's STAGE name from a folder name or path ("03_online_softmax",
    "bench/cublas_fp32"), or a stage number ("3", "03"). A folder's Makefile may set STAGE
    (the cuBLAS baselines do); otherwise it is the folder's name, as in common/stage.mk."""
    root = Path(root)
    text = str(stage).rstrip("/")
    if re.fullmatch(r"\d{1,2}", text):
        matches = sorted(p.name for p in root.glob(f"{int(text):02d}_*") if p.is_dir())
        if len(matches) != 1:
            raise FileNotFoundError(f"stage {text!r}: expected one folder {int(text):02d}_* "
                                    f"under {root}, found {matches or 'none'}")
        text = matches[0]
    folder = Path(text) if Path(text).is_absolute() else root / text
    if not folder.is_dir() and (root / "bench" / text).is_dir():
        folder = root / "bench" / text  # "cublas_fp32" for bench/cublas_fp32
    makefile = folder / "Makefile"
    if makefile.is_file():
        match = re.search(r"^STAGE\s*:?=\s*(\S+)", makefile.read_text(), re.MULTILINE)
        if match:
            return match.group(1)
    return folder.name


def library_path(stage: Union[str, os.PathLike], root: Union[str, os.PathLike] = ROOT) -> Path:
    """build/<STAGE>/libattention_<STAGE>.so for a stage (see stage_name), or the path itself
    when it names a .so file."""
    if str(stage).endswith(".so"):
        return Path(stage)
    name = stage_name(stage, root)
    return Path(root) / "build" / name / f"libattention_{name}.so"


class Stage:
    """One stage's library. Not thread-bound: the library keeps each thread's last error."""

    def __init__(self, path: Union[str, os.PathLike]):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path} does not exist: build it with make (e.g. "
                                    f"make -C <stage folder> all)")
        # RTLD_LOCAL (ctypes' default on Linux, said here for the reader): the names stay in
        # this library's handle, so another stage's library with the same names can be loaded.
        self.lib = ctypes.CDLL(str(self.path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        lib = self.lib
        p, i, s = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_CShape)
        lib.attention_c_abi_version.argtypes, lib.attention_c_abi_version.restype = [], i
        lib.attention_c_capabilities.argtypes = [ctypes.POINTER(_CCapabilities)]
        lib.attention_c_workspace_bytes.argtypes = [s, ctypes.POINTER(ctypes.c_size_t)]
        lib.attention_c_backward_workspace_bytes.argtypes = [s, ctypes.POINTER(ctypes.c_size_t)]
        lib.attention_c_forward.argtypes = [p, p, p, p, p, s, p]
        lib.attention_c_backward.argtypes = [p, p, p, p, p, p, p, p, p, p, s, p]
        for name in ("capabilities", "workspace_bytes", "backward_workspace_bytes", "forward",
                     "backward"):
            getattr(lib, "attention_c_" + name).restype = i
        lib.attention_c_last_error.argtypes, lib.attention_c_last_error.restype = [], ctypes.c_char_p
        version = lib.attention_c_abi_version()
        if version != ABI_VERSION:
            raise RuntimeError(f"{self.path}: C ABI version {version}, this loader reads version "
                               f"{ABI_VERSION}: rebuild the library or update stage_abi.py")
        record = _CCapabilities()
        self._check(lib.attention_c_capabilities(ctypes.byref(record)))
        self.capabilities = Capabilities(
            name=record.name.decode(), dtype=record.dtype.decode(),
            head_dims=tuple(record.head_dims[: record.head_dim_count]),
            max_len_q=record.max_len_q, max_len_kv=record.max_len_kv, causal=bool(record.causal),
            backward=bool(record.backward), alignment_bytes=record.alignment_bytes,
            compute_capability=record.compute_capability,
            deterministic_backward=bool(record.deterministic_backward),
            key_centre_backward=bool(record.key_centre_backward))

    def __repr__(self) -> str:
        return f"Stage({self.capabilities.name!r}, {str(self.path)!r})"

    @property
    def name(self) -> str:
        return self.capabilities.name

    def workspace_bytes(self, shape: ShapeLike) -> int:
        """Device memory the forward allocates for `shape` (ValueError for a shape it refuses)."""
        bytes_ = ctypes.c_size_t(0)
        self._check(self.lib.attention_c_workspace_bytes(_c_shape(shape), ctypes.byref(bytes_)))
        return bytes_.value

    def backward_workspace_bytes(self, shape: ShapeLike) -> int:
        """The same for the backward; ValueError "<stage> has no backward pass" without one,
        and for shape.deterministic where the stage has no deterministic backward."""
        bytes_ = ctypes.c_size_t(0)
        self._check(self.lib.attention_c_backward_workspace_bytes(_c_shape(shape),
                                                                  ctypes.byref(bytes_)))
        return bytes_.value

    def forward(self, q: Pointer, k: Pointer, v: Pointer, o: Pointer, lse: Pointer,
                shape: ShapeLike, stream: Pointer = 0) -> None:
        """O (and lse, unless 0) from Q, K, V: asynchronous on `stream`."""
        self._check(self.lib.attention_c_forward(
            _address(q, "q"), _address(k, "k"), _address(v, "v"), _address(o, "o"),
            _address(lse, "lse"), _c_shape(shape), _address(stream, "stream")))

    def backward(self, q: Pointer, k: Pointer, v: Pointer, o: Pointer, lse: Pointer,
                 dout: Pointer, dq: Pointer, dk: Pointer, dv: Pointer, shape: ShapeLike,
                 stream: Pointer = 0, key_centre: Pointer = 0) -> None:
        """dQ, dK, dV from the forward's inputs, o, lse and dout: asynchronous on `stream`.
        With shape.deterministic, bit-identical from run to run (ValueError where the stage
        lacks capabilities.deterministic_backward). key_centre (0: none): the address of an FP32
        [batch * heads, head_dim] centre for the centred dQ instead of the mean of the call's
        keys (ValueError where the stage lacks capabilities.key_centre_backward)."""
        self._check(self.lib.attention_c_backward(
            _address(q, "q"), _address(k, "k"), _address(v, "v"), _address(o, "o"),
            _address(lse, "lse"), _address(dout, "dout"), _address(dq, "dq"),
            _address(dk, "dk"), _address(dv, "dv"), _address(key_centre, "key_centre"),
            _c_shape(shape), _address(stream, "stream")))

    def _check(self, code: int) -> None:
        if code == OK:
            return
        message = (self.lib.attention_c_last_error() or b"").decode(errors="replace")
        if code == INVALID_ARGUMENT:
            raise ValueError(message)
        raise RuntimeError(message if code == RUNTIME_ERROR else f"code {code}: {message}")


def load(stage: Union[str, os.PathLike], root: Union[str, os.PathLike] = ROOT) -> Stage:
    """The library of a stage: a folder name or path ("03_online_softmax", "bench/cublas_bf16"),
    a suite name ("cublas_bf16"), a stage number ("3"), or the .so's path. root: the repository
    (default: the one this file is in)."""
    return Stage(library_path(stage, root))


def _c_shape(shape: ShapeLike):
    if not isinstance(shape, Shape):
        shape = Shape(*shape)
    return ctypes.byref(_CShape(shape.batch, shape.heads, shape.len_q, shape.len_kv,
                                shape.head_dim, int(shape.causal), shape.scale,
                                int(shape.deterministic)))


def _address(pointer: Pointer, field: str) -> Optional[int]:
    if pointer is None:
        return None
    if isinstance(pointer, bool) or not isinstance(pointer, int):
        raise TypeError(f"{field}: expected an integer device address (e.g. tensor.data_ptr()), "
                        f"got {type(pointer).__name__}")
    return pointer or None
