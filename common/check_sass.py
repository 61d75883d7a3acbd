#!/usr/bin/env python3
"""Does the compiled code overlap the softmax with the GEMMs, as chapter 10 says it does?

In the ping-pong consumer, tile j's S = Q K^T is issued with wgmma, then the consumer waits
for the previous tile's P V and S with `wgmma.wait_group 1` and computes tile j's softmax while
P V of tile j-1 still runs on the tensor cores, and only then waits for it with
`wgmma.wait_group 0`. In SASS the two waits are `WARPGROUP.DEPBAR.LE gsb0, 0x1` and
`WARPGROUP.DEPBAR.LE gsb0, 0x0`, and the softmax's exponentials are `MUFU.EX2`. ptxas may move
the waits: the source alone does not prove the overlap.

This reads `cuobjdump -sass` of an object or library and, for every kernel whose name matches
--kernel, takes the MUFU.EX2 that lie in a loop (from a backward branch's target to the branch:
the first tile's softmax, before the loop, has no earlier P V to hide under) and counts how
many of them lie between a wait_group 1 and the next wait_group 0, in address order. It passes
when all of them do, and fails (exit 1) otherwise or when no loop issues MUFU.EX2.

--exempt-head-dim D reports the kernels of head dimension D (the first value of the kernel's
Tiling) without failing on them: stage 10 keeps the overlap at D = 128 only, because at D = 64
the exponent unit, not the schedule, bounds the loop and the overlapped form measured slower
(lab notes 10).

usage: check_sass.py FILE [--kernel REGEX] [--exempt-head-dim D ...] [--cuobjdump PATH]
"""
import argparse
import re
import shutil
import subprocess
import sys

INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"^(?:@!?U?P\w+\s+)?BRA(?:\.\w+)*\s+(?:`?\(?)?0x([0-9a-f]+)")
WAIT_ONE = "WARPGROUP.DEPBAR.LE gsb0, 0x1"
WAIT_ZERO = "WARPGROUP.DEPBAR.LE gsb0, 0x0"


def functions(sass):
    """{mangled name: [(address, instruction text)]} from cuobjdump -sass output."""
    found, name = {}, None
    for line in sass.splitlines():
        header = re.search(r"Function : (\S+)", line)
        if header:
            name = header.group(1)
            found[name] = []
            continue
        match = INSTRUCTION.search(line)
        if name and match:
            found[name].append((int(match.group(1), 16), match.group(2).strip()))
    return found


def loop_exponentials(code):
    """The addresses of the MUFU.EX2 that lie in a loop: between a backward branch's target
    and the branch. Only branches before the kernel's last EXIT count: after it ptxas places
    the out-of-line retries of the mbarrier waits, which jump back into the body from the end
    and close no loop."""
    exps = [address for address, text in code if text.startswith("MUFU.EX2")]
    last_exit = max((address for address, text in code if re.search(r"(^|\s)EXIT\b", text)),
                    default=0)
    loops = []
    for address, text in code:
        branch = BRANCH.match(text)
        if branch and int(branch.group(1), 16) < address < last_exit:
            loops.append((int(branch.group(1), 16), address))
    return {e for e in exps if any(start <= e <= end for start, end in loops)}


def in_windows(code):
    """The addresses of the MUFU.EX2 between a wait_group 1 and the next wait_group 0."""
    inside, found = False, set()
    for address, text in code:
        if text == WAIT_ONE:
            inside = True
        elif text == WAIT_ZERO:
            inside = False
        elif inside and text.startswith("MUFU.EX2"):
            found.add(address)
    return found


def check(kernels, exempt_head_dims=()):
    """One line per kernel of {name: code}, and whether a kernel that must overlap does not."""
    lines, failed = [], False
    for name, code in kernels.items():
        tiling = re.search(r"TilingI((?:Li\d+E)+)", name)
        values = re.findall(r"Li(\d+)E", tiling.group(1)) if tiling else []
        label = f"Tiling<{', '.join(values)}>" if tiling else name[:80]
        flag = re.search(r"TilingI(?:Li\d+E)+EELb([01])E", name)  # stage 12's ONE_TILE
        if flag:
            label += ", one tile" if flag.group(1) == "1" else ", persistent"
        looped = loop_exponentials(code)
        under = looped & in_windows(code)
        everything = sum(text.startswith("MUFU.EX2") for _, text in code)
        ok = bool(looped) and under == looped
        exempt = bool(values) and int(values[0]) in exempt_head_dims
        verdict = "ok" if ok else f"not required at D = {values[0]}" if exempt else "FAIL"
        failed |= not ok and not exempt
        lines.append(f"{label}: {len(under)} of the {len(looped)} MUFU.EX2 in its loops lie "
                     f"between wgmma.wait_group 1 and 0 ({everything} in the kernel): {verdict}")
    return lines, failed


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", help="an object, cubin or shared library with sm_90a SASS")
    parser.add_argument("--kernel", default="pingpong", help="regex on the mangled kernel names")
    parser.add_argument("--exempt-head-dim", type=int, action="append", default=[],
                        help="report the kernels of this head dimension without failing")
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    arguments = parser.parse_args()
    try:
        sass = subprocess.run([arguments.cuobjdump, "-sass", arguments.file], check=True,
                              capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        print(f"check_sass: cannot read the SASS of {arguments.file} with "
              f"{arguments.cuobjdump}: {error}", file=sys.stderr)
        return 2
    kernels = {name: code for name, code in functions(sass).items()
               if re.search(arguments.kernel, name)}
    if not kernels:
        print(f"check_sass: no kernel matching '{arguments.kernel}' in {arguments.file}: FAIL")
        return 1
    lines, failed = check(kernels, arguments.exempt_head_dim)
    print("\n".join(lines))
    print(f"check_sass: {arguments.file}: "
          f"{'FAIL: the softmax is not under the GEMMs' if failed else 'the softmax overlaps'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
