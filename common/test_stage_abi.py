#!/usr/bin/env python3
"""The C ABI from Python, without a GPU (run by .ci/run): two stages' libraries loaded into one
process with common/stage_abi.py, each answering with its own code and its own capability
record, bad input refused by name as ValueError, the deterministic flag (ABI version 2)
refused by a backward without the mode, passed through by one with it, and the backward's
key_centre (ABI version 3) likewise: refused by name by a backward without it, passed through
(and checked for alignment) by one with it. Prints one line; exits 1 on a failure.

    python3 common/test_stage_abi.py                       # 03_online_softmax and 07_backward
    python3 common/test_stage_abi.py 04_warp_shuffle 11_hopper_backward

The libraries must be built first (make -C 03_online_softmax all; make -C 07_backward all).
"""

import ctypes
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stage_abi  # noqa: E402

checks = 0
failures = []

# Addresses that are never dereferenced: every call below is refused before anything runs.
FAKE = [(i + 1) << 32 for i in range(9)]
CENTRE = 10 << 32  # a key_centre's address, apart from the tensors'


def check(condition, what):
    global checks
    checks += 1
    if not condition:
        failures.append(what)


def expect(error, needles, call, what):
    """call() raises `error` with a message holding every one of `needles`."""
    try:
        call()
    except error as raised:
        message = str(raised)
        check(all(n in message for n in needles), f"{what}: {message!r} lacks one of {needles}")
        return
    except Exception as raised:  # noqa: BLE001: any other outcome is a failure, reported
        check(False, f"{what}: {type(raised).__name__} ({raised}) instead of {error.__name__}")
        return
    check(False, f"{what}: no {error.__name__}")


def check_stage(stage, others):
    caps = stage.capabilities
    name = caps.name
    check(stage.path.name == f"libattention_{name}.so", f"{name}: loaded {stage.path}")
    check(caps.dtype in ("fp32", "bf16"), f"{name}: dtype {caps.dtype!r}")
    check(64 in caps.head_dims and 128 in caps.head_dims, f"{name}: head dims {caps.head_dims}")
    check(caps.max_len_q >= 1 and caps.max_len_kv >= 1, f"{name}: lengths {caps}")
    check(caps.alignment_bytes >= caps.element_bytes, f"{name}: alignment {caps.alignment_bytes}")
    check(isinstance(caps.deterministic_backward, bool) and
          (caps.backward or not caps.deterministic_backward),
          f"{name}: deterministic_backward {caps.deterministic_backward!r} "
          f"(backward {caps.backward})")
    check(isinstance(caps.key_centre_backward, bool) and
          (caps.backward or not caps.key_centre_backward),
          f"{name}: key_centre_backward {caps.key_centre_backward!r} (backward {caps.backward})")
    good = stage_abi.Shape(1, 2, 17, 33, caps.head_dims[0], causal=True)
    workspace = stage.workspace_bytes(good)
    check(isinstance(workspace, int) and workspace >= 0, f"{name}: workspace {workspace!r}")
    check(stage.lib.attention_c_last_error() == b"", f"{name}: last error not cleared by a success")

    q, k, v, o, lse, dout, dq, dk, dv = FAKE
    expect(ValueError, ["q = null"], lambda: stage.forward(0, k, v, o, lse, good), f"{name}: null q")
    expect(ValueError, ["k = null"], lambda: stage.forward(q, None, v, o, 0, good), f"{name}: null k")
    # The message names the stage whose code refused it: each library runs its own validation.
    bad = stage_abi.Shape(1, 2, 17, 33, 72)
    expect(ValueError, ["head_dim = 72", name], lambda: stage.forward(q, k, v, o, lse, bad),
           f"{name}: head_dim 72")
    expect(ValueError, ["head_dim = 72", name], lambda: stage.workspace_bytes(bad),
           f"{name}: workspace of head_dim 72")
    expect(ValueError, ["causal = 2"],
           lambda: stage.forward(q, k, v, o, lse, (1, 2, 17, 33, caps.head_dims[0], 2, 0.0)),
           f"{name}: causal 2")
    expect(ValueError, ["deterministic = 2"],
           lambda: stage.forward(q, k, v, o, lse, (1, 2, 17, 33, caps.head_dims[0], 1, 0.0, 2)),
           f"{name}: deterministic 2")
    expect(TypeError, ["q"], lambda: stage.forward(1.5, k, v, o, lse, good), f"{name}: float q")
    # The forward takes deterministic as it is: the same workspace, the same first refusal.
    fixed = dataclasses.replace(good, deterministic=True)
    check(stage.workspace_bytes(fixed) == workspace, f"{name}: forward workspace, deterministic")
    expect(ValueError, ["q = null"], lambda: stage.forward(0, k, v, o, lse, fixed),
           f"{name}: null q, deterministic")
    code = stage.lib.attention_c_forward(q, k, v, o, lse, None, None)
    check(code == stage_abi.INVALID_ARGUMENT and b"shape = null" in stage.lib.attention_c_last_error(),
          f"{name}: null shape gave {code}, {stage.lib.attention_c_last_error()!r}")
    # Another library's success leaves this library's message alone.
    for other in others:
        other.workspace_bytes(stage_abi.Shape(1, 1, 8, 8, other.capabilities.head_dims[0]))
    check(b"shape = null" in stage.lib.attention_c_last_error(),
          f"{name}: its message changed by another library's call")

    if caps.backward:
        check(stage.backward_workspace_bytes(good) > 0, f"{name}: backward workspace")
        expect(ValueError, ["dq = null"],
               lambda: stage.backward(q, k, v, o, lse, dout, 0, dk, dv, good), f"{name}: null dq")
    else:
        no_backward = f"{name} has no backward pass"
        expect(ValueError, [no_backward], lambda: stage.backward_workspace_bytes(good),
               f"{name}: backward workspace")
        expect(ValueError, [no_backward],
               lambda: stage.backward(q, k, v, o, lse, dout, dq, dk, dv, good), f"{name}: backward")
        expect(ValueError, [no_backward],
               lambda: stage.backward(q, k, v, o, lse, dout, dq, dk, dv, fixed),
               f"{name}: deterministic backward")
        expect(ValueError, [no_backward],
               lambda: stage.backward(q, k, v, o, lse, dout, dq, dk, dv, good, 0, CENTRE),
               f"{name}: backward with a key_centre")
    if caps.key_centre_backward:
        # Let through to the null dq; misaligned, refused by name.
        expect(ValueError, ["dq = null"],
               lambda: stage.backward(q, k, v, o, lse, dout, 0, dk, dv, good, 0, CENTRE),
               f"{name}: null dq, key_centre")
        expect(ValueError, ["key_centre = ", f"aligned to {caps.alignment_bytes} bytes"],
               lambda: stage.backward(q, k, v, o, lse, dout, dq, dk, dv, good, 0, CENTRE + 2),
               f"{name}: misaligned key_centre")
    elif caps.backward:
        # Refused by name, ahead of the null dq.
        expect(ValueError, ["key_centre = ", "is not allowed", name],
               lambda: stage.backward(q, k, v, o, lse, dout, 0, dk, dv, good, 0, CENTRE),
               f"{name}: key_centre")
    if caps.deterministic_backward:
        # Let through to the null dq; the mode's own workspace (its ordering state) on top.
        check(stage.backward_workspace_bytes(fixed) > stage.backward_workspace_bytes(good),
              f"{name}: deterministic backward workspace")
        expect(ValueError, ["dq = null"],
               lambda: stage.backward(q, k, v, o, lse, dout, 0, dk, dv, fixed),
               f"{name}: null dq, deterministic")
    elif caps.backward:
        # Refused by name, ahead of the null dq, and no workspace answered for it.
        refused = ["deterministic = true is not allowed", name]
        expect(ValueError, refused, lambda: stage.backward_workspace_bytes(fixed),
               f"{name}: deterministic backward workspace")
        expect(ValueError, refused,
               lambda: stage.backward(q, k, v, o, lse, dout, 0, dk, dv, fixed),
               f"{name}: deterministic backward")


def main(names):
    # How load() finds the suites: a folder, a number, a baseline's folder or suite name.
    check(stage_abi.stage_name("3") == "03_online_softmax", "stage number 3")
    check(stage_abi.stage_name("bench/cublas_fp32") == "cublas_fp32", "bench/cublas_fp32")
    check(stage_abi.library_path("cublas_bf16") ==
          stage_abi.ROOT / "build/cublas_bf16/libattention_cublas_bf16.so", "cublas_bf16's path")
    try:
        # The first library joins the global scope, as a framework's loader may make it: the
        # names it defines (the same C++ names in every stage) must not capture the others'.
        ctypes.CDLL(str(stage_abi.library_path(names[0])), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        stages = [stage_abi.load(name) for name in names]
    except (OSError, RuntimeError, ValueError) as error:
        print(f"stage ABI: FAILED to load {', '.join(names)}: {error}")
        return 1
    records = [s.capabilities for s in stages]
    check(len({r.name for r in records}) == len(records), f"names not distinct: {records}")
    for stage, name in zip(stages, names):
        check(stage.capabilities.name == stage_abi.stage_name(name),
              f"{name}: the library says it is {stage.capabilities.name}")
        check_stage(stage, [s for s in stages if s is not stage])
    described = " and ".join(
        f"{r.name} ({r.dtype}{', backward' if r.backward else ''}"
        f"{', deterministic backward' if r.deterministic_backward else ''})" for r in records)
    if failures:
        for failure in failures:
            print(f"FAIL: {failure}", file=sys.stderr)
        print(f"stage ABI: {len(failures)} of {checks} checks FAILED ({described} in one process)")
        return 1
    print(f"stage ABI: {described} loaded in one process, {checks} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["03_online_softmax", "07_backward"]))
