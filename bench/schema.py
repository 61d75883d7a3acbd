"""The one Python definition of what the C++ driver (common/bench.cpp) and the Python scripts
share: the results CSV's columns, the FLOP convention, the sweeps file's format, and the stage
list (read from the top-level Makefile's STAGES, its one place)."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Must match kCsvHeader in common/bench.cpp.
CSV_COLUMNS = ["gpu", "stage", "dtype", "batch", "heads", "len_q", "len_kv", "head_dim", "causal",
               "pass", "median_ms", "min_ms", "tflops", "pct_sol", "workspace_bytes", "commit",
               "status"]

FLOP_CONVENTION = ("FLOPs follow the FlashAttention convention: forward 4*B*H*Lq*Lk*D (halved "
                   "when causal), backward 2.5x forward; TFLOP/s = FLOPs / median time")


def read_sweeps(path=REPO / "bench" / "sweeps.txt"):
    """{name: [(batch, heads, len_q, len_kv, head_dim, causal), ...]} from lines
    `name batch heads len_q len_kv head_dim causal` (# starts a comment)."""
    sweeps = {}
    with open(path) as sweeps_file:
        for number, line in enumerate(sweeps_file, 1):
            fields = line.split("#")[0].split()
            if not fields:
                continue
            if len(fields) != 7:
                raise SystemExit(f"{path}:{number}: expected "
                                 "'name batch heads len_q len_kv head_dim causal'")
            sweeps.setdefault(fields[0], []).append(tuple(int(f) for f in fields[1:]))
    return sweeps


def read_stages(makefile=REPO / "Makefile"):
    """The stage folders, in order, from `STAGES := ...` (with its continuation lines)."""
    text = Path(makefile).read_text()
    match = re.search(r"^STAGES\s*:=((?:[^\n]*\\\n)*[^\n]*)", text, re.MULTILINE)
    if not match:
        raise SystemExit(f"{makefile}: no STAGES := line")
    return match.group(1).replace("\\\n", " ").split()


STAGES = read_stages()
