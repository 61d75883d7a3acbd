#!/usr/bin/env python3
"""What a ping-pong consumer executes per K/V tile, read from the SASS (no GPU needed).

For every kernel of an object or library whose name matches --kernel, this finds the
consumer's main loop (the innermost loop, closed by a backward branch before the kernel's last
EXIT, that holds `WARPGROUP.DEPBAR.LE gsb0, 0x1` and HGMMA) and walks the path one K/V tile
takes through it: from the loop's first instruction to its backward branch, through the
shorter arm of every branch inside the loop (the tile that needs no mask: the masked arm holds
the mask and its own copy of the softmax), never into the out-of-line retries of the mbarrier
waits (their targets lie after the last EXIT) or the divergent path of a shuffle (`BRA.DIV`).
It counts that path's instructions by class, and lists what lies between consecutive HGMMA:
the descriptor work that feeds each one.

Classes: `uniform` is the uniform datapath (every opcode that starts with U, plus S2UR),
`R2UR` the moves from ordinary to uniform registers (wgmma takes its descriptors from uniform
registers), `HGMMA` the wgmma themselves, `MUFU` the exponent unit, `fp32` FFMA/FMUL/FADD/FMNMX
and friends, `convert` F2FP (the packing of P), `int` the ordinary integer datapath, `sync`
barriers, mbarrier operations and the wgmma fences and waits, `other` the rest (branches,
shuffles, constants, NOPs).

sass_tile_counts.py, beside it, reads the same kind of path for another question (stage 10's
D = 64 kernel with exponentials moved to the FMA pipe: the cycles of issue, MUFU and the tensor
cores per sub-partition); the two find the tile's path in their own ways, and each made its own
evidence (docs/profiles/README.md, the programs), so both stay.

usage: sass_tile_profile.py FILE [--kernel REGEX] [--cuobjdump PATH] [--hgmma-gaps] [--listing]
"""
import argparse
import collections
import heapq
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))
import check_sass  # noqa: E402  (functions(): the SASS listing split by kernel; in_windows)

BRANCH = re.compile(r"^(@!?U?P\w+\s+)?BRA(\.[\w.]+)?\s+(?:U?P\w+,\s*)?`?\(?0x([0-9a-f]+)")
WAIT_ONE, WAIT_ZERO = check_sass.WAIT_ONE, check_sass.WAIT_ZERO

FP32 = {"FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "FSETP", "FCHK", "FMUL2", "FADD2", "FFMA2"}
INT = {"IMAD", "IADD3", "LOP3", "SHF", "LEA", "ISETP", "SEL", "MOV", "VIADD", "IABS", "PRMT",
       "IMNMX", "VIMNMX", "I2F", "F2I", "PLOP3", "P2R", "R2P", "IADD", "IMUL", "SGXT", "BMSK",
       "FLO", "POPC", "VIADDMNMX", "LEA.HI", "I2FP", "F2IP", "ISCADD"}
SYNC_PREFIXES = ("BAR", "SYNCS", "WARPGROUP", "WARPSYNC", "MEMBAR", "FENCE", "DEPBAR", "ERRBAR",
                 "CCTL", "NANOSLEEP")


def opcode(text):
    """The instruction's mnemonic without its predicate and modifiers."""
    text = re.sub(r"^@!?U?P\w+\s+", "", text)
    return text.split()[0] if text else ""


def classify(text):
    op = opcode(text)
    base = op.split(".")[0]
    if base == "HGMMA":
        return "HGMMA"
    if base == "R2UR":
        return "R2UR"
    if base == "MUFU":
        return "MUFU"
    if base.startswith(SYNC_PREFIXES):
        return "sync"
    if base == "S2UR" or (base.startswith("U") and base not in ("UTMALDG", "UTMASTG",
                                                                 "UBLKCP", "UTMAPF")):
        return "uniform"
    if base in FP32:
        return "fp32"
    if base in ("F2FP", "F2F"):
        return "convert"
    if base in ("LDL", "STL"):
        return "local"
    if base in INT:
        return "int"
    return "other"


def loops(code):
    """(start, end) of every loop closed by a backward branch before the last EXIT."""
    last_exit = max((a for a, t in code if re.search(r"(^|\s)EXIT\b", t)), default=0)
    found = []
    for address, text in code:
        branch = BRANCH.match(text)
        if branch and int(branch.group(3), 16) < address < last_exit:
            found.append((int(branch.group(3), 16), address))
    return found


def consumer_loop(code):
    """The innermost loop that holds a wgmma.wait_group 1 and an HGMMA (the K/V tile loop)."""
    best = None
    for start, end in loops(code):
        body = [t for a, t in code if start <= a <= end]
        if WAIT_ONE in body and any(t.startswith("HGMMA") for t in body):
            if best is None or end - start < best[1] - best[0]:
                best = (start, end)
    return best


def tile_path(code, start, end):
    """The shortest path (in instructions) from start to the loop's backward branch at end,
    inside [start, end]: the instructions one unmasked K/V tile executes."""
    index = {a: i for i, (a, _) in enumerate(code)}
    addresses = [a for a, _ in code]

    def successors(i):
        address, text = code[i]
        branch = BRANCH.match(text)
        following = [i + 1] if i + 1 < len(code) else []
        if not branch:
            return following
        target = int(branch.group(3), 16)
        conditional = branch.group(1) is not None or ".DIV" in (branch.group(2) or "") \
            or ".U.ANY" in (branch.group(2) or "")
        if address == end:
            return []  # the backward branch closes the tile
        if not (start <= target <= end) or ".DIV" in (branch.group(2) or ""):
            return following  # a retry or a divergent path: not the tile's own path
        return ([index[target]] + following) if conditional else [index[target]]

    first, last = index[start], index[end]
    distance = {first: 1}
    previous = {}
    heap = [(1, first)]
    while heap:
        d, i = heapq.heappop(heap)
        if i == last:
            break
        if d > distance.get(i, 1 << 30):
            continue
        for j in successors(i):
            if not (first <= j <= last):
                continue
            if d + 1 < distance.get(j, 1 << 30):
                distance[j] = d + 1
                previous[j] = i
                heapq.heappush(heap, (d + 1, j))
    path, i = [], last
    while True:
        path.append(i)
        if i == first:
            break
        i = previous[i]
    del addresses
    return [code[i] for i in reversed(path)]


def hgmma_gaps(path):
    """For each HGMMA on the path, the uniform and R2UR instructions since the previous one."""
    rows, since = [], collections.Counter()
    for _, text in path:
        kind = classify(text)
        if kind == "HGMMA":
            operands = re.findall(r"gdesc\[(UR\d+)\]", text)
            rows.append((text.split()[0], operands[0] if operands else "?", dict(since)))
            since = collections.Counter()
        elif kind in ("uniform", "R2UR"):
            since[kind] += 1
    return rows


def describe(name, code, show_gaps=False, listing=False):
    tiling = re.search(r"TilingI((?:Li\d+E)+)", name)
    values = re.findall(r"Li(\d+)E", tiling.group(1)) if tiling else []
    label = f"Tiling<{', '.join(values)}>" if tiling else name[:80]
    total = collections.Counter(classify(t) for _, t in code)
    lines = [f"{label}: {len(code)} instructions in the kernel; "
             f"R2UR {total['R2UR']}, uniform {total['uniform']}, HGMMA {total['HGMMA']}, "
             f"local (spill) {total['local']}"]
    found = consumer_loop(code)
    if not found:
        lines.append("  no consumer loop found")
        return lines
    start, end = found
    body = [(a, t) for a, t in code if start <= a <= end]
    path = tile_path(code, start, end)
    per_tile = collections.Counter(classify(t) for _, t in path)
    lines.append(f"  consumer K/V loop 0x{start:x}-0x{end:x}: {len(body)} instructions "
                 f"(both arms of the mask branch); one unmasked tile executes {len(path)}")
    order = ["HGMMA", "R2UR", "uniform", "int", "fp32", "MUFU", "convert", "sync", "local",
             "other"]
    lines.append("  per tile: " + ", ".join(f"{k} {per_tile[k]}" for k in order))
    waits = [i for i, (_, t) in enumerate(path) if t in (WAIT_ONE, WAIT_ZERO)]
    first_hgmma = next(i for i, (_, t) in enumerate(path) if t.startswith("HGMMA"))
    last_hgmma = max(i for i, (_, t) in enumerate(path) if t.startswith("HGMMA"))
    exps_between = len(check_sass.in_windows(path))
    lines.append(f"  on that path: first HGMMA at instruction {first_hgmma}, last at "
                 f"{last_hgmma} (issue span {last_hgmma - first_hgmma + 1}); waits at "
                 + ", ".join(f"{i} ({'1' if path[i][1] == WAIT_ONE else '0'})" for i in waits)
                 + f"; {exps_between} of {per_tile['MUFU']} MUFU between wait 1 and wait 0")
    turn = [i for i, (_, t) in enumerate(path) if re.match(r"BAR\.SYNC.*0x100", t)]
    passed = [i for i, (_, t) in enumerate(path) if re.match(r"(@!?P\w+\s+)?BAR\.ARV.*0x100", t)]
    if turn and passed:
        held = collections.Counter(classify(t) for _, t in path[turn[0] + 1:passed[-1]])
        lines.append(f"  the turn is held from instruction {turn[0]} (BAR.SYNC) to {passed[-1]} "
                     f"(BAR.ARV): {passed[-1] - turn[0] - 1} instructions in between: " + ", ".join(
                         f"{k} {held[k]}" for k in order if held[k]))
    between = collections.Counter(classify(t) for _, t in path[first_hgmma:last_hgmma + 1])
    lines.append("  from the first HGMMA to the last: " + ", ".join(
        f"{k} {between[k]}" for k in order if between[k]))
    if show_gaps:
        for op, operand, since in hgmma_gaps(path):
            lines.append(f"    {op} gdesc[{operand}]: before it uniform {since.get('uniform', 0)}, "
                         f"R2UR {since.get('R2UR', 0)}")
    if listing:
        lines += [f"    /*{a:04x}*/ {t}" for a, t in path]
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", help="an object, cubin or shared library with sm_90a SASS")
    parser.add_argument("--kernel", default="pingpong", help="regex on the mangled kernel names")
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    parser.add_argument("--hgmma-gaps", action="store_true",
                        help="list the uniform and R2UR instructions before each HGMMA")
    parser.add_argument("--listing", action="store_true", help="print the tile's path")
    arguments = parser.parse_args()
    sass = subprocess.run([arguments.cuobjdump, "-sass", arguments.file], check=True,
                          capture_output=True, text=True).stdout
    kernels = {n: c for n, c in check_sass.functions(sass).items()
               if re.search(arguments.kernel, n)}
    for name, code in kernels.items():
        print("\n".join(describe(name, code, arguments.hgmma_gaps, arguments.listing)))
    return 0 if kernels else 1


if __name__ == "__main__":
    sys.exit(main())
