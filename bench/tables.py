#!/usr/bin/env python3
"""Writes the results tables of the markdown files from a benchmark results CSV.

A table lives between two marker comments, and everything between them is generated:

    <!-- results:NAME [option=value ...] -->
    <!-- /results:NAME -->

NAME is either
  * a sweep of bench/sweeps.txt (fp32-headline, bf16-headline, seqlen, extra, ...):
      - a sweep of one shape gives one row per implementation and pass: median time, TFLOP/s,
        % of SOL and the speedup over the baseline implementation (00_naive by default);
      - a sweep of several shapes gives one row per shape and one column per implementation
        (median ms), for one pass (fwd unless pass= says otherwise);
  * NN_name (a stage folder; stage:NN_name also works), a chapter's own table: the stage
    against its predecessor and the baselines of its element type, at both headline shapes;
  * ceilings: the ceilings measured in the same run (ceilings.csv beside the results CSV);
  * sdpa-fp32: seed 003's table, the FP32 stages (stages=, default 04_warp_shuffle) against
    PyTorch's FP32 SDPA over the non-causal seqlen sweep at d = 64: torch_sdpa (the default
    dispatch) where the run has it, else torch_efficient (the fused backend that takes FP32).
Options: stages=a,b,c (implementations, in that order; default all), pass=fwd|bwd|bwd_det
(bwd_det: the deterministic backward, timed at a few shapes only; shown only when asked for),
dtype=fp32|bf16, causal=0|1, baseline=NAME.

A number inside a sentence is generated the same way, from one row of the same run:

    <!-- value:IMPLEMENTATION[/DTYPE] SHAPE PASS FIELD -->195.1<!-- /value -->
    <!-- value:ceiling NAME -->696.0<!-- /value -->

The ring's rows (13_ring_attention, bench/results/<gpu>/ring/ring-xP.csv) give a number or a
range the same way, over the ring's rows of one CSV that match every KEY=VALUE (a column of the
CSV, or per_gpu_min / per_gpu_max on the tokens per GPU):

    <!-- value:ring CSV [KEY=VALUE ...] FIELD -->0.91–0.96<!-- /value -->

FIELD: efficiency, median_ms, tflops_per_gpu or baseline_tflops (the CSV's columns; the last
the ring's kernels alone), aa (the A/A: aa_median_ms over median_ms)
or vs_torch (PyTorch's context parallelism's median time
at the same GPUs, length, mask and pass over the ring's, with a ×); optionally :DIGITS
(efficiency:3); one matching row gives its value, several their lowest–highest.

SHAPE is a sweep of one shape (bf16-headline) or BxHxLqxLkxDxCAUSAL (4x8x4096x4096x64x0);
A value whose implementation has no row at all in the results (a stage newer than the
committed run), or no row of that pass, is pending and rendered as "…", like a stage table
without results.
FIELD is median_ms, min_ms, tflops, pct_sol, workspace (bytes in MiB/GiB) or
speedup=OTHER (OTHER's median over this one's, with a ×) or time_ratio=SHAPE (this
median over the same implementation's at SHAPE); either may end in :DIGITS, the decimal places
of the ratio (2 unless said).

Code on the page comes from the stages' files. In a .cu file, one comment line opens an
excerpt and one closes it:

    // excerpt: NAME
    ...
    // end excerpt

and a chapter shows it between

    <!-- code:NN_name/attention.cu#NAME -->
    <!-- /code:NN_name/attention.cu#NAME -->

(common indentation removed, other excerpt markers inside it dropped). --check also fails
when a chapter names an excerpt that no file holds, when an excerpt is longer than
MAX_EXCERPT_LINES, and when a stage file marks an excerpt that no chapter shows (once the
stage has its README.md).

A committed text file (a program's summary, say) is shown verbatim, in a fenced block, between

    <!-- file:PATH -->
    <!-- /file:PATH -->

with PATH relative to the repository's root, so that its numbers are never typed by hand.

A `<!-- symbols:check -->` region (docs/background.md's table of symbols) names code
identifiers as `name` (NN, NN-NN); each must occur in those stages' attention.cu outside its
comments, and every stage of the top-level Makefile's STAGES (read by bench/schema.py) must be
named at least once, so the table reaches the last stage.

docs/profiles/README.md indexes the profiler evidence: between <!-- profiles:index --> markers,
rows `| [`PATH`](PATH) | claim | cited by |`; the last column is generated from the pages that
name docs/profiles/PATH (or, for a folder's own README.md, its file name or a glob in
backticks), and a file not in the index, a row without its file, or a file no page cites is an
error, unless its claim ends with "(not yet cited)".

usage: bench/tables.py [--results CSV] [--check] [FILE.md ...]
Without files: every markdown file of the repository that holds a marker. --check rewrites
nothing and exits 1 when a table differs from what the CSV gives (stale).
"""

import argparse
import fnmatch
import csv
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"<!-- results:(?P<name>[^\s>]+)(?P<options>[^>]*?)\s*-->\n"
                    r"(?P<body>.*?)<!-- /results:(?P=name) -->", re.S)
HEADLINES = ["fp32-headline", "bf16-headline"]
VALUE = re.compile(r"<!-- value:(?P<spec>[^>]*?)\s*-->(?P<body>.*?)<!-- /value -->", re.S)
CODE = re.compile(r"<!-- code:(?P<name>[^\s>#]+#[^\s>]+)\s*-->\n(?P<body>.*?)"
                  r"<!-- /code:(?P=name) -->", re.S)
FILE = re.compile(r"<!-- file:(?P<name>[^\s>]+)\s*-->\n(?P<body>.*?)<!-- /file:(?P=name) -->", re.S)
EXCERPT_BEGIN = re.compile(r"^\s*// excerpt: (?P<name>\S+)\s*$")
EXCERPT_END = re.compile(r"^\s*// end excerpt\s*$")
MAX_EXCERPT_LINES = 40
PENDING = "…"
FLOPS_NOTE = ("FLOPs: FlashAttention convention, forward 4·B·H·Lq·Lk·D (halved when causal), "
              "backward 2.5× forward; % of SOL against the cuBLAS GEMM ceiling of the row's "
              "element type measured in the same run (bf16_gemm or fp32_gemm in ceilings.csv, "
              "whose method column says how).")


def repo_glob(pattern):
    """The paths under ROOT that match `pattern` (recursive), less those git ignores: a stage copied
    aside for an A/B run (.git/info/exclude) must count neither as a page that cites a profile
    nor as a stage's code. Outside a git checkout, every match."""
    paths = sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True))
    if not paths:
        return paths
    try:
        result = subprocess.run(["git", "-C", ROOT, "check-ignore", "--stdin", "-z"], input="\0".join(paths),
                                capture_output=True, text=True)
    except OSError:
        return paths
    if result.returncode not in (0, 1):  # 1: nothing ignored; otherwise not a checkout
        return paths
    ignored = set(result.stdout.split("\0"))
    return [path for path in paths if path not in ignored]


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from schema import BASELINES, STAGES, read_sweeps  # noqa: E402,F401  (the one parser of bench/sweeps.txt)
from ring_table import TORCH, aa_ratio, collapse_rounds, read_rows  # noqa: E402  (the ring CSVs' one reader)


def read_results(path):
    """{(stage, dtype, shape, pass): row}; a later row replaces an earlier one."""
    rows = {}
    with open(path, newline="") as results_file:
        for row in csv.DictReader(results_file):
            shape = tuple(int(row[key]) for key in
                          ("batch", "heads", "len_q", "len_kv", "head_dim", "causal"))
            rows[(row["stage"], row["dtype"], shape, row["pass"])] = row
    return rows


def medians_by_shape(path, pass_name="fwd", dtype="bf16"):
    """{shape: {implementation: median ms}} of a results CSV's rows of one pass and element type
    that ran (status ok)."""
    medians = {}
    for (implementation, row_dtype, shape, row_pass), row in read_results(path).items():
        if row_dtype == dtype and row_pass == pass_name and row["status"] == "ok":
            medians.setdefault(shape, {})[implementation] = float(row["median_ms"])
    return medians


def implementation_order(stage):
    """Stages by number, then the baselines in bench/schema.py's one order, then anything else."""
    if re.match(r"\d\d_", stage):
        return (0, 0, stage)
    if stage in BASELINES:
        return (1, BASELINES.index(stage), stage)
    return (2, 0, stage)


def describe(shape):
    batch, heads, len_q, len_kv, head_dim, causal = shape
    text = f"B={batch} H={heads} Lq={len_q} Lk={len_kv} D={head_dim}"
    return text + (" causal" if causal else "")


def milliseconds(value):
    value = float(value)
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def one_decimal(text):
    return f"{float(text):.1f}" if text else "–"


def speedup(base_row, row):
    if not base_row or not row or base_row["status"] != "ok" or row["status"] != "ok":
        return "–"
    return f"{float(base_row['median_ms']) / float(row['median_ms']):.2f}×"


def table(header, lines):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return out


def run_setting(results_path):
    """", PyTorch 2.11.0 with cuDNN 9.19.0, interleaved slices" from the system.txt beside the
    results (cuDNN's speed changes from version to version), or "" where it does not say."""
    system = os.path.join(os.path.dirname(results_path), "system.txt")
    if not os.path.exists(system):
        return ""
    text = open(system).read()
    parts = []
    torch_line = re.search(r"^torch: (\S+)[^\n]*?cudnn (\d+)", text, re.MULTILINE)
    if torch_line:
        version = int(torch_line.group(2))
        major, minor, patch = version // 10000, version // 100 % 100, version % 100
        if version < 10000:  # cuDNN 8 and older: major * 1000 + minor * 100 + patch
            major, minor, patch = version // 1000, version // 100 % 10, version % 100
        parts.append(f"PyTorch {torch_line.group(1)} with cuDNN {major}.{minor}.{patch}")
    if re.search(r"^method: interleaved slices", text, re.MULTILINE):
        parts.append("every implementation timed in interleaved slices (docs/benchmarking.md)")
    return "".join(", " + part for part in parts)


class Tables:
    def __init__(self, results_path, sweeps_path):
        self.results_path = results_path
        self.rows = read_results(results_path)
        self.pending = []
        self.sweeps = read_sweeps(sweeps_path)
        gpus = sorted({row["gpu"] for row in self.rows.values()})
        commits = sorted({row["commit"] for row in self.rows.values()})
        self.caption = (f"_{', '.join(gpus) or 'no results'}, commit {', '.join(commits) or '–'}"
                        f"{run_setting(results_path)}; generated by bench/tables.py from "
                        f"{os.path.relpath(results_path, ROOT)}. {FLOPS_NOTE}_")

    def implementations(self, options):
        """[(stage, dtype)] present in the results, filtered and ordered by the options."""
        present = sorted({(key[0], key[1]) for key in self.rows},
                         key=lambda item: (implementation_order(item[0]), item[1]))
        if "dtype" in options:
            present = [item for item in present if item[1] == options["dtype"]]
        if "stages" in options:
            wanted = options["stages"].split(",")
            present = sorted((item for item in present if item[0] in wanted),
                             key=lambda item: (wanted.index(item[0]), item[1]))
        return present

    def find(self, implementation, shape, pass_name):
        return self.rows.get((implementation[0], implementation[1], shape, pass_name))

    def render(self, name, options):
        if name.startswith("stage:"):
            lines = self.stage_table(name.split(":", 1)[1], options)
        elif re.match(r"\d\d_", name):
            lines = self.stage_table(name, options)
        elif name == "ceilings":
            lines = self.ceilings_table()
        elif name == "sdpa-fp32":
            lines = self.sdpa_fp32_table(options)
        elif name not in self.sweeps:
            raise SystemExit(f"results:{name}: no such sweep in bench/sweeps.txt")
        elif len(self.sweeps[name]) == 1:
            lines = self.shape_table(self.sweeps[name][0], self.implementations(options), options)
        else:
            lines = self.sweep_table(self.sweeps[name], options)
        return "\n".join([self.caption, ""] + lines) + "\n"

    def value(self, spec):
        words = spec.split()
        if words and words[0] == "ring":
            return ring_value(spec)
        if len(words) == 2 and words[0] == "ceiling":
            path = os.path.join(os.path.dirname(self.results_path), "ceilings.csv")
            with open(path, newline="") as ceilings_file:
                for row in csv.DictReader(ceilings_file):
                    if row["ceiling"] == words[1]:
                        return f"{float(row['value']):.1f}"
            raise SystemExit(f"value:{spec}: no ceiling {words[1]} in {path}")
        if len(words) != 4:
            raise SystemExit(f"value:{spec}: want IMPLEMENTATION SHAPE PASS FIELD")
        implementation, shape_text, pass_name, field = words
        field, _, digits = field.partition(":")
        places = int(digits or 2)  # of a ratio (speedup, time_ratio)
        shape = parse_shape(shape_text, self.sweeps)
        # A stage newer than the committed run has no row at all yet: its values stay pending
        # (rendered as an ellipsis) until the next `make bench`, as its results table does.
        # So are the values of a pass the committed run has no row of (the deterministic backward's
        # bwd_det before the run that first timed it).
        named = [implementation] + ([field.split("=", 1)[1]] if field.startswith("speedup=") else [])
        if any(not any(key[0] == name.partition("/")[0] and key[3] == pass_name for key in self.rows)
               for name in named):
            self.pending.append(spec)
            return PENDING

        def row_of(name, at=shape):
            stage, _, dtype = name.partition("/")
            matches = [row for key, row in self.rows.items() if key[0] == stage and
                       (not dtype or key[1] == dtype) and key[2] == at and key[3] == pass_name]
            if len(matches) != 1:
                raise SystemExit(f"value:{spec}: {len(matches)} rows for {name} "
                                 f"(name the dtype: {stage}/fp32)")
            if matches[0]["status"] != "ok":
                raise SystemExit(f"value:{spec}: {name} was {matches[0]['status']}")
            return matches[0]

        row = row_of(implementation)
        if field in ("median_ms", "min_ms"):
            return milliseconds(row[field])
        if field in ("tflops", "pct_sol"):
            return one_decimal(row[field])
        if field == "workspace":
            return byte_size(row["workspace_bytes"])
        if field.startswith("time_ratio="):
            other = row_of(implementation, parse_shape(field.split("=", 1)[1], self.sweeps))
            return f"{float(row['median_ms']) / float(other['median_ms']):.{places}f}"
        if field.startswith("speedup="):
            other = row_of(field.split("=", 1)[1])
            return f"{float(other['median_ms']) / float(row['median_ms']):.{places}f}×"
        raise SystemExit(f"value:{spec}: unknown field {field}")

    def ceilings_table(self):
        path = os.path.join(os.path.dirname(self.results_path), "ceilings.csv")
        if not os.path.exists(path):
            return [f"No {os.path.relpath(path, ROOT)} yet: run `make bench`."]
        with open(path, newline="") as ceilings_file:
            rows = list(csv.DictReader(ceilings_file))
        lines = [[row["ceiling"], f"{float(row['value']):.1f} {row['unit']}", row["method"]]
                 for row in rows]
        return table(["ceiling", "measured", "how"], lines)

    def sdpa_fp32_table(self, options):
        """N, PyTorch's FP32 SDPA, each chosen FP32 stage and its speedup over SDPA."""
        stages = options.get("stages", "04_warp_shuffle").split(",")
        baseline = "torch_sdpa" if any(key[0] == "torch_sdpa" for key in self.rows) \
            else "torch_efficient"
        shapes = [shape for shape in self.sweeps.get("seqlen", [])
                  if shape[4] == 64 and not shape[5] and shape[2] == shape[3]]
        lines = []
        for shape in shapes:
            base = self.find((baseline, "fp32"), shape, "fwd")
            if not base or base["status"] != "ok":
                continue
            cells = [str(shape[2]), milliseconds(base["median_ms"])]
            for stage in stages:
                row = self.find((stage, "fp32"), shape, "fwd")
                ok = row and row["status"] == "ok"
                cells += [milliseconds(row["median_ms"]) if ok else "–", speedup(base, row)]
            lines.append(cells)
        if not lines:
            return ["No PyTorch FP32 SDPA rows in this run (they need PyTorch): run `make bench` "
                    "where `import torch` works."]
        batch, heads, head_dim = shapes[0][0], shapes[0][1], shapes[0][4]
        which = ("`torch_sdpa`, PyTorch's default dispatch" if baseline == "torch_sdpa" else
                 "`torch_efficient`, the fused SDPA backend that takes FP32 (this run has no "
                 "`torch_sdpa` rows, PyTorch's default dispatch)")
        header = ["N", f"{baseline} ms"]
        for stage in stages:
            header += [f"{stage} ms", f"{stage} over {baseline}"]
        return [f"**forward, B={batch} H={heads} Lq=Lk=N D={head_dim}, non-causal; "
                f"PyTorch FP32 SDPA: {which}**", ""] + table(header, lines)

    def shape_table(self, shape, implementations, options, baseline=None):
        """One row per (implementation, pass) at one shape."""
        baseline = baseline or options.get("baseline", "00_naive")
        passes = shown_passes(options, one_shape=True)
        lines = []
        for pass_name in passes:
            base_rows = [self.find(item, shape, pass_name) for item in implementations
                         if item[0] == baseline]
            base_row = base_rows[0] if base_rows else None
            for implementation in implementations:
                row = self.find(implementation, shape, pass_name)
                if row is None or "no backward pass" in row["status"]:
                    continue
                if row["status"] != "ok":
                    lines.append([implementation[0], implementation[1], pass_name,
                                  row["status"], "–", "–", "–"])
                    continue
                lines.append([implementation[0], implementation[1], pass_name,
                              milliseconds(row["median_ms"]), one_decimal(row["tflops"]),
                              one_decimal(row["pct_sol"]), speedup(base_row, row)])
        header = ["implementation", "dtype", "pass", "median ms", "TFLOP/s", "% of SOL",
                  f"speedup over {baseline}"]
        return [f"**{describe(shape)}**", ""] + table(header, lines)

    def sweep_table(self, shapes, options):
        """One row per shape, one column of median ms per implementation."""
        pass_name = shown_passes(options, one_shape=False)[0]
        shapes = shown_shapes(shapes, options)
        implementations = [item for item in self.implementations(options)
                           if any(self.find(item, shape, pass_name) for shape in shapes)]
        lines = []
        for shape in shapes:
            cells = [describe(shape)]
            for implementation in implementations:
                row = self.find(implementation, shape, pass_name)
                if row is None:
                    cells.append("")
                elif row["status"] != "ok":
                    cells.append("skipped")
                else:
                    cells.append(milliseconds(row["median_ms"]))
            lines.append(cells)
        header = ["shape"] + [f"{stage} ({dtype})" for stage, dtype in implementations]
        return [f"**{pass_name}, median ms** (skipped: see the CSV for the reason)", ""] + \
            table(header, lines)

    def stage_table(self, stage, options):
        """The stage, its predecessor and the baselines of its element type at both headlines."""
        dtypes = sorted({key[1] for key in self.rows if key[0] == stage})
        if not dtypes:
            return [f"No results for {stage} yet: run `make bench`."]
        numbered = sorted({key[0] for key in self.rows if re.match(r"\d\d_", key[0])})
        earlier = [name for name in numbered if name < stage]
        predecessor = earlier[-1] if earlier else None
        implementations = [(stage, dtype) for dtype in dtypes]
        if predecessor:
            implementations += [item for item in self.implementations({})
                                if item[0] == predecessor]
        implementations += [item for item in self.implementations({})
                            if item[1] in dtypes and not re.match(r"\d\d_", item[0])]
        lines = []
        for headline in HEADLINES:
            for shape in self.sweeps.get(headline, []):
                lines += self.shape_table(shape, implementations, options,
                                          baseline=predecessor or stage) + [""]
        return lines[:-1]


def shown_passes(options, one_shape):
    """The passes a results table shows: pass= if given, else both for a table of one shape and
    the forward for a sweep's table."""
    if "pass" in options:
        return [options["pass"]]
    return ["fwd", "bwd"] if one_shape else ["fwd"]


def shown_shapes(shapes, options):
    """A sweep table's shapes: causal= keeps the shapes of that mask."""
    if "causal" not in options:
        return shapes
    return [shape for shape in shapes if shape[5] == int(options["causal"])]


def table_shapes(name, options, sweeps):
    """The (shape, pass) pairs the results table NAME with these options shows (render's cases):
    a stage's table both headlines, a one-shape sweep its shape, a sweep its shown shapes; none
    for the ceilings and the FP32 SDPA table, which compare no BF16 stage with a baseline."""
    if name.startswith("stage:") or re.match(r"\d\d_", name):
        shapes = [shape for headline in HEADLINES for shape in sweeps.get(headline, [])]
        return {(shape, p) for shape in shapes for p in shown_passes(options, one_shape=True)}
    if name not in sweeps or name in ("ceilings", "sdpa-fp32"):
        return set()
    if len(sweeps[name]) == 1:
        return {(sweeps[name][0], p) for p in shown_passes(options, one_shape=True)}
    return {(shape, p) for shape in shown_shapes(sweeps[name], options)
            for p in shown_passes(options, one_shape=False)}


def quoted_shapes(pages, sweeps):
    """{(shape, pass)} that the pages (markdown texts) quote: every results table's shown shapes
    and every value marker's shape and pass."""
    found = set()
    for text in pages:
        for marker in MARKER.finditer(text):
            found |= table_shapes(marker["name"], parse_options(marker["options"]), sweeps)
        for value in VALUE.finditer(text):
            words = value["spec"].split()
            if len(words) == 4 and words[0] != "ring":
                found.add((parse_shape(words[1], sweeps), words[2]))
    return found


def read_excerpts(path):
    """{name: [lines]} of one source file; raises SystemExit on an unbalanced marker."""
    excerpts, open_names = {}, []
    with open(path) as source:
        for number, line in enumerate(source, 1):
            begin = EXCERPT_BEGIN.match(line)
            if begin:
                name = begin["name"]
                if name in excerpts or name in open_names:
                    raise SystemExit(f"{path}:{number}: excerpt {name} marked twice")
                open_names.append(name)
                excerpts[name] = []
                continue
            if EXCERPT_END.match(line):
                if not open_names:
                    raise SystemExit(f"{path}:{number}: '// end excerpt' without an excerpt")
                open_names.pop()
                continue
            for name in open_names:
                excerpts[name].append(line.rstrip("\n"))
    if open_names:
        raise SystemExit(f"{path}: excerpt {open_names[-1]} never ends")
    return excerpts


class Excerpts:
    """The excerpts of the stages' files, rendered as fenced code blocks."""

    def __init__(self):
        self.cache = {}
        self.shown = set()

    def lines(self, reference):
        relative, _, name = reference.partition("#")
        path = os.path.join(ROOT, relative)
        if path not in self.cache:
            if not os.path.exists(path):
                raise SystemExit(f"code:{reference}: no file {relative}")
            self.cache[path] = read_excerpts(path)
        if name not in self.cache[path]:
            raise SystemExit(f"code:{reference}: {relative} has no '// excerpt: {name}'")
        self.shown.add((relative, name))
        return self.cache[path][name]

    def render(self, reference, markdown_path):
        lines = self.lines(reference)
        # Preprocessor lines sit in column 0 and would stop a plain dedent.
        indents = [len(line) - len(line.lstrip()) for line in lines
                   if line.strip() and not line.lstrip().startswith("#")]
        cut = min(indents, default=0)
        code = "\n".join(line if line.lstrip().startswith("#") else line[cut:]
                         for line in lines).strip("\n")
        relative, _, name = reference.partition("#")
        link = os.path.relpath(os.path.join(ROOT, relative), os.path.dirname(markdown_path))
        return (f"```cuda\n{code}\n```\n"
                f"_From [`{relative}`]({link}), excerpt `{name}`; "
                f"copied by bench/tables.py._\n")

    def problems(self, stage_files):
        found = []
        everything = {os.path.relpath(path, ROOT): read_excerpts(path) for path in stage_files}
        for path in stage_files:
            relative = os.path.relpath(path, ROOT)
            for name, lines in everything[relative].items():
                # A stage that carries an earlier stage's code verbatim (07's forward is 06's)
                # carries its markers too, so that the copy stays identical; a copy of an
                # excerpt another chapter shows needs no chapter of its own.
                copy_of_shown = any(other != relative and (other, name) in self.shown and
                                    excerpts.get(name) == lines
                                    for other, excerpts in everything.items())
                # A stage whose chapter is not written yet may mark its excerpts ahead of it.
                chapter = os.path.join(ROOT, relative.split(os.sep)[0], "README.md")
                if not os.path.exists(chapter) and relative.split(os.sep)[0] != "common":
                    continue
                if (relative, name) not in self.shown and not copy_of_shown:
                    found.append(f"{relative}: excerpt {name} is shown by no chapter")
                if len(lines) > MAX_EXCERPT_LINES:
                    found.append(f"{relative}: excerpt {name} has {len(lines)} lines "
                                 f"(at most {MAX_EXCERPT_LINES})")
        return found


PROFILES = os.path.join(ROOT, "docs", "profiles")
PROFILES_INDEX = os.path.join(PROFILES, "README.md")
INDEX_REGION = re.compile(r"(<!-- profiles:index -->\n)(?P<body>.*?)(<!-- /profiles:index -->)", re.S)
INDEX_ROW = re.compile(r"^\| \[`(?P<path>[^`]+)`\]\((?P=path)\) \| (?P<claim>.*?) \|(?P<cited>[^|]*)\|$", re.M)


UNCITED_NOTE = "(not yet cited)"


def cites(page, page_text, path):
    """Whether a page names docs/profiles/PATH: by its path, or, in a note inside the file's
    own folder (docs/profiles/NN_name/README.md), by its name or a glob in backticks."""
    if re.search(r"profiles/" + re.escape(path) + r"(?![\w.-])", page_text):
        return True
    if os.path.dirname(page) == os.path.join(PROFILES, os.path.dirname(path)) and page != PROFILES_INDEX:
        for token in re.findall(r"`([^`\s]+)`", page_text):
            if fnmatch.fnmatch(os.path.basename(path), token):
                return True
    return False


def page_label(path):
    """How the index names a citing page: the chapter's stage, 'lab NN', or the file name."""
    relative = os.path.relpath(path, ROOT)
    parts = relative.split(os.sep)
    if len(parts) == 2 and re.match(r"\d\d_", parts[0]) and parts[1] == "README.md":
        label = parts[0][:2]
    elif parts[:2] == ["docs", "profiles"] and parts[-1] == "README.md":
        label = "notes of " + parts[2]
    elif parts[:2] == ["docs", "lab-notes"]:
        label = "lab " + parts[2][:2]
    else:
        label = relative
    return f"[{label}]({os.path.relpath(path, PROFILES)})"


def profiles_index(check):
    """Regenerates the cited-by column of docs/profiles/README.md; returns (stale, problems)."""
    if not os.path.exists(PROFILES_INDEX):
        return [], []
    with open(PROFILES_INDEX) as index_file:
        text = index_file.read()
    region = INDEX_REGION.search(text)
    if not region:
        return [], ["docs/profiles/README.md: no <!-- profiles:index --> region"]
    pages = {}
    for path in repo_glob(os.path.join("**", "*.md")):
        relative = os.path.relpath(path, ROOT)
        if relative.split(os.sep)[0] in ("build", ".git", ".deps") or path == PROFILES_INDEX:
            continue
        with open(path) as page:
            pages[path] = page.read()
    problems, notes, listed = [], [], set()

    def regenerate(row):
        path = row["path"]
        listed.add(path)
        if not os.path.exists(os.path.join(PROFILES, path)):
            problems.append(f"docs/profiles/README.md: {path} does not exist")
        cited = sorted(page_label(page) for page, page_text in pages.items()
                       if cites(page, page_text, path))
        if not cited:
            if row["claim"].rstrip().endswith(UNCITED_NOTE):
                notes.append(f"docs/profiles/{path}: not yet cited (marked in the index)")
            else:
                problems.append(f"docs/profiles/{path}: cited by no page")
        return f"| [`{path}`]({path}) | {row['claim']} | {', '.join(cited)} |"

    body = INDEX_ROW.sub(regenerate, region["body"])
    for path in glob.glob(os.path.join(PROFILES, "**", "*"), recursive=True):
        relative = os.path.relpath(path, PROFILES)
        if os.path.isfile(path) and os.path.basename(path) != "README.md" and relative not in listed:
            problems.append(f"docs/profiles/{relative}: missing from docs/profiles/README.md")
    for note in notes:
        print("note: " + note)
    updated = text[:region.start("body")] + body + text[region.end("body"):]
    stale = ["docs/profiles/README.md: cited-by column"] if updated != text else []
    if updated != text and not check:
        with open(PROFILES_INDEX, "w") as index_file:
            index_file.write(updated)
    return stale, problems


SYMBOLS_REGION = re.compile(r"<!-- symbols:check -->(?P<body>.*?)<!-- /symbols:check -->", re.S)
SYMBOL_USE = re.compile(r"`(?P<name>[A-Za-z_][A-Za-z_0-9]*)` \((?P<stages>[0-9, -]+)\)")
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def stage_code(number):
    """Stage NN's attention.cu without its comments (a name only a comment holds is not in the code)."""
    found = repo_glob(os.path.join(f"{number:02d}_*", "attention.cu"))
    return COMMENT.sub(" ", open(found[0]).read()) if found else ""


def symbol_problems(path, text):
    """Every `identifier` (NN, NN-NN) in a symbols:check region must occur in the code (comments
    left out) of those stages' attention.cu, and the region must name every stage of the
    top-level Makefile's STAGES (bench/schema.py), so that a new stage fails until the table
    reaches it."""
    problems = []
    sources = {}
    for region in SYMBOLS_REGION.finditer(text):
        covered = set()
        for use in SYMBOL_USE.finditer(region["body"]):
            stages = []
            for part in use["stages"].split(","):
                first, _, last = part.strip().partition("-")
                stages += range(int(first), int(last or first) + 1)
            for number in stages:
                covered.add(number)
                if number not in sources:
                    sources[number] = stage_code(number)
                if not re.search(r"\b" + re.escape(use["name"]) + r"\b", sources[number]):
                    problems.append(f"{os.path.relpath(path, ROOT)}: `{use['name']}` is not in "
                                    f"stage {number:02d}'s attention.cu")
        for stage in STAGES:
            if int(stage[:2]) not in covered:
                problems.append(f"{os.path.relpath(path, ROOT)}: the symbols table names nothing "
                                f"of stage {stage} (the Makefile's STAGES)")
    return problems


def parse_shape(text, sweeps):
    if text in sweeps:
        if len(sweeps[text]) != 1:
            raise SystemExit(f"value: sweep {text} has {len(sweeps[text])} shapes, not one")
        return sweeps[text][0]
    fields = text.split("x")
    if len(fields) != 6:
        raise SystemExit(f"value: '{text}' is neither a one-shape sweep nor BxHxLqxLkxDxCAUSAL")
    return tuple(int(field) for field in fields)


def ring_value(spec):
    """<!-- value:ring CSV [KEY=VALUE ...] FIELD[:DIGITS] -->: one number, or the lowest and
    highest, over the ring's rows of CSV that match every KEY=VALUE."""
    words = spec.split()
    if len(words) < 3:
        raise SystemExit(f"value:{spec}: want ring CSV [KEY=VALUE ...] FIELD")
    path, conditions, (field, _, digits) = words[1], words[2:-1], words[-1].partition(":")
    rows = collapse_rounds(read_rows([os.path.join(ROOT, path)]))
    torch = {(row["gpus"], row["len"], row["causal"], row["pass"]): float(row["median_ms"])
             for row in rows if row["sharding"].startswith(TORCH)}
    chosen = [row for row in rows if not row["sharding"].startswith("torch")]
    for condition in conditions:
        key, _, wanted = condition.partition("=")
        if key in ("per_gpu_min", "per_gpu_max"):
            sign = 1 if key == "per_gpu_min" else -1
            chosen = [row for row in chosen
                      if sign * (int(row["len"]) // int(row["gpus"]) - int(wanted)) >= 0]
        elif chosen and key not in chosen[0]:
            raise SystemExit(f"value:{spec}: {path} has no column {key}")
        else:
            chosen = [row for row in chosen if row[key] == wanted]
    if not chosen:
        raise SystemExit(f"value:{spec}: no ring row of {path} matches")
    if field == "efficiency":
        values, unit = [float(row["efficiency"]) for row in chosen], ""
    elif field == "vs_torch":
        keys = [(row["gpus"], row["len"], row["causal"], row["pass"]) for row in chosen]
        if any(key not in torch for key in keys):
            raise SystemExit(f"value:{spec}: a row without PyTorch's beside it in {path}")
        values = [torch[key] / float(row["median_ms"]) for key, row in zip(keys, chosen)]
        unit = "×"
    elif field in ("median_ms", "tflops_per_gpu", "baseline_tflops"):
        values, unit = [float(row[field]) for row in chosen], ""
    elif field == "aa":
        values, unit = [aa_ratio(row) for row in chosen], ""
        if None in values:
            raise SystemExit(f"value:{spec}: a row without the A/A column in {path}")
    else:
        raise SystemExit(f"value:{spec}: unknown field {field} (efficiency, vs_torch, median_ms, "
                         "tflops_per_gpu, baseline_tflops, aa)")
    places = int(digits or 2)
    low, high = f"{min(values):.{places}f}", f"{max(values):.{places}f}"
    return (low if low == high else f"{low}–{high}") + unit


def byte_size(value):
    value = float(value)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value / size:.{0 if value % size == 0 else 1}f} {unit}"
    return f"{value:.0f} B"


def markdown_files():
    found = []
    for path in repo_glob(os.path.join("**", "*.md")):
        relative = os.path.relpath(path, ROOT)
        if relative.split(os.sep)[0] in ("build", ".git", ".deps") or \
                relative.startswith(os.path.join("bench", "results")):
            continue
        with open(path) as markdown:
            text = markdown.read()
            if any(marker in text for marker in ("<!-- results:", "<!-- value:", "<!-- code:",
                                                 "<!-- file:", "<!-- symbols:check")):
                found.append(path)
    return sorted(found)


def shown_file(name, page):
    """What a <!-- file:NAME --> region of `page` holds: the file, verbatim, in a fenced block."""
    shown = os.path.join(ROOT, name)
    if not os.path.isfile(shown):
        raise SystemExit(f"{page}: file:{name}: no such file")
    with open(shown) as source:
        return "```text\n" + source.read().rstrip("\n") + "\n```\n"


def default_results():
    candidates = sorted(glob.glob(os.path.join(ROOT, "bench", "results", "*", "results.csv")))
    if len(candidates) != 1:
        raise SystemExit("tables.py: pass --results (found "
                         f"{len(candidates)} bench/results/*/results.csv)")
    return candidates[0]


def parse_options(text):
    options = {}
    for item in text.split():
        key, _, value = item.partition("=")
        options[key] = value
    return options


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*")
    parser.add_argument("--results")
    parser.add_argument("--sweeps", default=os.path.join(ROOT, "bench", "sweeps.txt"))
    parser.add_argument("--check", action="store_true")
    arguments = parser.parse_args()

    files = arguments.files or markdown_files()
    if not files:
        print("tables.py: no markdown file holds a results marker")
        return 0
    tables = Tables(arguments.results or default_results(), arguments.sweeps)
    excerpts = Excerpts()
    stale = []
    all_symbol_errors = []
    for path in files:
        with open(path) as markdown:
            text = markdown.read()

        def regenerate(match):
            body = tables.render(match["name"], parse_options(match["options"]))
            if body != match["body"]:
                stale.append(f"{os.path.relpath(path, ROOT)}: results:{match['name']}")
            begin = match.start("body") - match.start()
            end = match.end("body") - match.start()
            return match.group(0)[:begin] + body + match.group(0)[end:]

        def regenerate_value(match):
            body = tables.value(match["spec"])
            if body != match["body"]:
                stale.append(f"{os.path.relpath(path, ROOT)}: value:{match['spec']}")
            return match.group(0).replace(match["body"] + "<!-- /value -->",
                                          body + "<!-- /value -->")

        def regenerate_code(match):
            body = excerpts.render(match["name"], os.path.abspath(path))
            if body != match["body"]:
                stale.append(f"{os.path.relpath(path, ROOT)}: code:{match['name']}")
            begin = match.start("body") - match.start()
            end = match.end("body") - match.start()
            return match.group(0)[:begin] + body + match.group(0)[end:]

        def regenerate_file(match):
            body = shown_file(match["name"], os.path.relpath(path, ROOT))
            if body != match["body"]:
                stale.append(f"{os.path.relpath(path, ROOT)}: file:{match['name']}")
            begin = match.start("body") - match.start()
            end = match.end("body") - match.start()
            return match.group(0)[:begin] + body + match.group(0)[end:]

        all_symbol_errors.extend(symbol_problems(path, text))
        updated = MARKER.sub(regenerate, text)
        updated = VALUE.sub(regenerate_value, updated)
        updated = CODE.sub(regenerate_code, updated)
        updated = FILE.sub(regenerate_file, updated)
        if not arguments.check and updated != text:
            with open(path, "w") as markdown:
                markdown.write(updated)
    if arguments.check:
        for entry in stale:
            print("stale: " + entry)
    problems = list(all_symbol_errors)
    problems += [] if arguments.files else excerpts.problems(
        repo_glob(os.path.join("[0-9][0-9]_*", "*.cu")) + repo_glob(os.path.join("common", "*.h*")))
    # make docs prints one line (.ci/check_messages.sh holds it to that); the pending values
    # (a stage newer than the committed run) are reported by the check.
    if tables.pending and arguments.check:
        print(f"tables.py: {len(tables.pending)} value(s) pending: their implementation has no row "
              f"in {os.path.relpath(tables.results_path, ROOT)} yet (run `make bench`)")
    if not arguments.files:
        index_stale, index_problems = profiles_index(arguments.check)
        stale += index_stale
        problems += index_problems
        if arguments.check:
            for entry in index_stale:
                print("stale: " + entry)
    if not arguments.check:
        # make docs: one line, what it rewrote (or that nothing changed).
        changed = list(dict.fromkeys(entry.split(": ")[0] for entry in stale))
        if changed:
            print(f"docs: updated {len(stale)} generated block(s) in {', '.join(changed)}")
        else:
            print(f"docs: nothing changed ({len(files)} file(s) with generated blocks, and the "
                  "profiles index, already match the CSVs and the code)" if not arguments.files
                  else f"docs: nothing changed in {', '.join(files)}")
    for problem in problems:
        print("error: " + problem)
    if arguments.check and stale:
        print("tables.py: run `make docs` (python3 bench/tables.py) to regenerate them")
    return 1 if problems or (arguments.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
