#!/usr/bin/env python3
"""Draws the chapters' diagrams from the constants the kernels use.

Every size in a picture (tile sizes, warps, lanes per row, pipeline buffers, the swizzle) is
read from the stages' source files, so a changed tile size changes the picture. The constants
read are written to constants.json beside the images; `--check` (run by `make docs-check`)
parses the sources again and fails when they no longer match the committed images.

usage: docs/diagrams/draw.py            redraw every PNG of docs/diagrams/ (needs matplotlib)
       docs/diagrams/draw.py --check    exit 1 when the sources' constants changed (no matplotlib)
"""

import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MANIFEST = os.path.join(HERE, "constants.json")


def source(path):
    with open(os.path.join(ROOT, path)) as handle:
        return handle.read()


def integer(path, pattern):
    """The first group of `pattern` in `path` as an int; fails loudly when it is gone."""
    match = re.search(pattern, source(path))
    if not match:
        raise SystemExit(f"draw.py: '{pattern}' not found in {path}: update the parser")
    return int(match.group(1))


def constants():
    """Everything the pictures depend on, read from the kernels' files."""
    found = {}
    for stage in ("02_tiled", "03_online_softmax"):
        path = f"{stage}/attention.cu"
        found[stage] = {
            "BLOCK_Q": integer(path, r"constexpr int BLOCK_Q = (\d+);"),
            "BLOCK_KV": integer(path, r"constexpr int BLOCK_KV = (\d+);"),
            "THREADS": integer(path, r"constexpr int THREADS = (\d+);"),
        }
    path = "04_warp_shuffle/attention.cu"
    found["04_warp_shuffle"] = {
        "BLOCK_Q": integer(path, r"#define \w*BLOCK_Q (\d+)"),
        "ROWS_PER_THREAD": integer(path, r"constexpr int ROWS_PER_THREAD = (\d+);"),
        "LANES_PER_ROW": integer(path, r"constexpr int LANES_PER_ROW = (\d+);"),
        "BLOCK_KV_D64": integer(path, r"BLOCK_KV = HEAD_DIM <= 64 \? (\d+) : \d+;"),
    }
    path = "05_mma_swizzle/attention.cu"
    found["05_mma_swizzle"] = {
        "WARPS": integer(path, r"constexpr int WARPS = (\d+);"),
        "ROWS_PER_WARP": integer(path, r"constexpr int ROWS_PER_WARP = (\d+);"),
        "BLOCK_KV": integer(path, r"constexpr int BLOCK_KV = (\d+);"),
    }
    swizzle = re.search(r"return SWIZZLED \? \(([^)]*\([^)]*\))\) : chunk;", source("common/swizzle.h"))
    if not swizzle:
        raise SystemExit("draw.py: the swizzle expression of common/swizzle.h changed: update the parser")
    found["swizzle"] = {"chunk_slot": swizzle.group(1),
                        "CHUNK_ELEMENTS": integer("common/swizzle.h",
                                                  r"CHUNK_ELEMENTS = (\d+);")}
    path = "06_pipelined/attention.cu"
    tiling = re.search(r"using Tiling128 = Tiling<128, (\d+), (\d+), (\d+), \d+>", source(path))
    if not tiling:
        raise SystemExit(f"draw.py: the Tiling128 line of {path} changed: update the parser")
    # K and V both double-buffered: the k_tiles and v_tiles comments give their shapes.
    k_buffers = re.search(r"bf16\* k_tiles = .*// \[(\d+)\]\[BLOCK_KV\]\[HEAD_DIM\]", source(path))
    v_buffers = re.search(r"bf16\* v_tiles = .*// \[(\d+)\]\[BLOCK_KV\]\[HEAD_DIM\]", source(path))
    if not k_buffers or not v_buffers:
        raise SystemExit(f"draw.py: the K and V buffers of {path} changed: update the parser")
    found["06_pipelined"] = {
        "WARPS": int(tiling.group(1)), "ROW_TILES": int(tiling.group(2)),
        "BLOCK_KV": int(tiling.group(3)), "V_BUFFERS": int(v_buffers.group(1)),
        "K_BUFFERS": int(k_buffers.group(1)),
    }
    path = "07_backward/attention.cu"
    one_pass = re.search(r"BLOCK_Q = HEAD_DIM == 64 \? (\d+) : (\d+), BLOCK_KV = (\d+);\s*"
                         r"static constexpr int WARPS = (\d+),", source(path))
    if not one_pass:
        raise SystemExit(f"draw.py: the one-pass tiling of {path} changed: update the parser")
    found["07_backward"] = {
        "BLOCK_Q_D128": int(one_pass.group(2)), "BLOCK_KV": int(one_pass.group(3)),
        "WARPS": int(one_pass.group(4)),
    }
    hopper_constants(found)
    return found


# ---- drawing ---------------------------------------------------------------------------

def setup():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": 10, "savefig.dpi": 130, "savefig.bbox": "tight"})
    return plt


QUERY_COLOUR, KEY_COLOUR, VALUE_COLOUR, STATE_COLOUR = "#4c72b0", "#dd8452", "#55a868", "#c44e52"


def save(plt, figure, name):
    figure.savefig(os.path.join(HERE, name))
    plt.close(figure)
    print(f"wrote docs/diagrams/{name}")


def tiling(plt, found, stage, name):
    """The score matrix of one head in tiles: which block owns which rows, and in which order
    it visits the K/V tiles (02: two passes; 03: one pass, causal tiles skipped)."""
    from matplotlib.patches import Rectangle, FancyArrowPatch
    block_q, block_kv = found[stage]["BLOCK_Q"], found[stage]["BLOCK_KV"]
    length = 8 * block_kv  # an example length: 8 KV tiles
    q_tiles, kv_tiles = length // block_q, length // block_kv
    one_pass = stage == "03_online_softmax"
    figure, axis = plt.subplots(figsize=(9.5, 5.4))
    for row in range(q_tiles):
        for col in range(kv_tiles):
            x, y = col * block_kv, row * block_q
            skipped = one_pass and x > (row + 1) * block_q - 1
            colour = "#eeeeee" if skipped else ("#c6d7ee" if row == 1 else "white")
            axis.add_patch(Rectangle((x, y), block_kv, block_q, facecolor=colour,
                                     edgecolor="#555555", linewidth=0.8))
            if row == 1 and not skipped:
                axis.text(x + block_kv / 2, y + block_q * 0.3, str(col + 1), ha="center",
                          va="center", fontsize=9, color="#1a3d6d")
    if one_pass:
        axis.plot([0, length], [0, length], color=STATE_COLOUR, linewidth=1, linestyle="--")
        axis.text(length * 0.78, block_q * 0.5, "causal diagonal (dashed);\ngrey tiles: skipped\nwhen causal",
                  color=STATE_COLOUR, fontsize=9, ha="center", va="center")
    arrow = FancyArrowPatch((0, 1.65 * block_q), (kv_tiles * block_kv if not one_pass else
                                                   2 * block_q, 1.65 * block_q),
                            arrowstyle="-|>", mutation_scale=14, color="#1a3d6d", linewidth=1.5)
    axis.add_patch(arrow)
    axis.set_xlim(-block_kv * 2.6, length + 2)
    axis.set_ylim(length + block_q * 0.1, -block_q * 1.1)
    axis.set_aspect("equal")
    axis.set_xticks([k * block_kv for k in range(kv_tiles + 1)])
    axis.set_yticks([q * block_q for q in range(q_tiles + 1)])
    axis.tick_params(labelsize=8)
    axis.set_xlabel(f"key index j  (tiles of BLOCK_KV = {block_kv})")
    axis.set_ylabel(f"query index i  (tiles of BLOCK_Q = {block_q})")
    for row in range(q_tiles):
        axis.text(-block_kv * 0.3, row * block_q + block_q / 2, f"block {row}", ha="right",
                  va="center", fontsize=8, color="#1a3d6d" if row == 1 else "#555555")
    axis.text(-block_kv * 2.5, -block_q * 0.55,
              f"S for one head, L = {length}; one thread block per row of tiles "
              f"({found[stage]['THREADS']} threads)", fontsize=9, ha="left")
    if one_pass:
        title = ("03: one pass. Block 1 visits its K/V tiles left to right once; after each tile "
                 "it updates m, l and O\n(rescaled by exp(m_old - m_new)); O is divided by l "
                 "after the last tile")
    else:
        title = ("02: two passes. Block 1 visits every K tile once for m and l (pass 1), then "
                 "every K and V tile again\nfor P = exp(S - m) / l and O += P V (pass 2); "
                 "the numbers are the visit order of one pass")
    axis.set_title(title, fontsize=9.5, loc="left")
    save(plt, figure, name)


def register_tiling(plt, found):
    """04: which scores of the S tile one thread owns, and the butterfly over the 8 lanes."""
    from matplotlib.patches import Rectangle, FancyArrowPatch
    constants_04 = found["04_warp_shuffle"]
    block_q, rows, lanes = (constants_04["BLOCK_Q"], constants_04["ROWS_PER_THREAD"],
                            constants_04["LANES_PER_ROW"])
    block_kv = constants_04["BLOCK_KV_D64"]
    row_groups = block_q // rows
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 6.2),
                                         gridspec_kw={"width_ratios": [1.25, 1], "wspace": 0.35})
    palette = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
               "#8c8c8c"]
    # Owner of S[row][col]: row group row % ROW_GROUPS, lane col % LANES_PER_ROW. Colour the
    # cells of row group 0 by lane, and mark the cells of thread (group 0, lane 0).
    for row in range(block_q):
        for col in range(block_kv):
            group, lane = row % row_groups, col % lanes
            in_warp = group < 32 // lanes  # row groups of warp 0
            colour = palette[lane % len(palette)] if in_warp else "#f2f2f2"
            alpha = (0.9 if group == 0 else 0.35) if in_warp else 1.0
            left.add_patch(Rectangle((col, row), 1, 1, facecolor=colour, alpha=alpha,
                                     edgecolor="white", linewidth=0.3))
            if group == 0 and lane == 0:
                left.text(col + 0.5, row + 0.5, "x", ha="center", va="center", fontsize=6.5,
                          color="black", fontweight="bold")
    left.set_xlim(0, block_kv)
    left.set_ylim(block_q, 0)
    left.set_aspect("equal")
    left.set_xlabel(f"key in the KV tile (BLOCK_KV = {block_kv} at D = 64)")
    left.set_ylabel(f"query row in the tile (BLOCK_Q = {block_q})")
    left.set_title(f"The S tile: row group g owns rows g + {row_groups}·r (r < {rows}); lane c of "
                   f"the group\nowns keys c + {lanes}·k. Coloured: warp 0 (row groups 0-{32 // lanes - 1}; "
                   f"group 0 darker), one colour\nper lane; x: the {rows} x {block_kv // lanes} "
                   f"scores of one thread (group 0, lane 0)", fontsize=9, loc="left")
    # The butterfly: log2(lanes) steps of __shfl_xor_sync over the lanes of one row.
    steps = []
    offset = 1
    while offset < lanes:
        steps.append(offset)
        offset *= 2
    for step_index in range(len(steps) + 1):
        y = step_index
        for lane in range(lanes):
            right.add_patch(Rectangle((lane - 0.35, y - 0.3), 0.7, 0.6,
                                      facecolor=palette[lane % len(palette)], alpha=0.85))
            width = 2 ** step_index
            first = lane - lane % width
            right.text(lane, y, f"{first}-{first + width - 1}" if width > 1 else str(lane),
                       ha="center", va="center", fontsize=7.5, color="white")
        if step_index < len(steps):
            offset = steps[step_index]
            for lane in range(lanes):
                partner = lane ^ offset
                right.add_patch(FancyArrowPatch((partner, y + 0.32), (lane, y + 0.68),
                                                arrowstyle="-|>", mutation_scale=7,
                                                color="#444444", linewidth=0.7))
            right.text(lanes - 0.2, y + 0.5, f"__shfl_xor_sync(..., {offset})", fontsize=8.5,
                       va="center")
    right.set_xlim(-0.6, lanes + 2.6)
    right.set_ylim(len(steps) + 0.6, -0.6)
    right.set_xticks(range(lanes))
    right.set_xlabel("lane of the row group")
    right.set_yticks(range(len(steps) + 1))
    right.set_yticklabels(["own partial max"] + [f"after step {k + 1}" for k in range(len(steps))])
    right.set_title(f"row_max / row_sum: {len(steps)} shuffles combine the {lanes} lanes of a "
                    f"row;\neach box says whose partial values a lane has combined",
                    fontsize=9, loc="left")
    for spine in right.spines.values():
        spine.set_visible(False)
    save(plt, figure, "04_register_tiling.png")


def mma_fragments(plt):
    """05: the operands of mma.sync.m16n8k16 and which lane holds which element (PTX ISA)."""
    from matplotlib.patches import Rectangle
    # Constrained layout keeps the two-line figure title clear of the panels' own titles.
    figure, axes = plt.subplots(1, 3, figsize=(14, 6.2), gridspec_kw={"width_ratios": [16, 8, 8]},
                                layout="constrained")

    def draw(axis, rows, cols, owner, title):
        for row in range(rows):
            for col in range(cols):
                lane, register = owner(row, col)
                quad = lane // 4
                colour = plt.cm.tab10(quad % 10)
                axis.add_patch(Rectangle((col, row), 1, 1, facecolor=colour, alpha=0.25 + 0.1 * (lane % 4),
                                         edgecolor="white", linewidth=0.5))
                axis.text(col + 0.5, row + 0.5, f"{lane}\n{register}", ha="center", va="center",
                          fontsize=5.8)
        axis.set_xlim(0, cols)
        axis.set_ylim(rows, 0)
        axis.set_aspect("equal")
        axis.set_xticks(range(0, cols + 1, 8))
        axis.set_yticks(range(0, rows + 1, 8))
        axis.set_title(title, fontsize=9.5, loc="left")

    # A (16 x 16, row major): register pair 0-1 rows g, cols 2t..; 2-3 rows g + 8; 4-5 cols + 8;
    # 6-7 both. g = lane / 4, t = lane % 4; one bf16 per half of a 32-bit register.
    def a_owner(row, col):
        lane = (row % 8) * 4 + (col % 8) // 2
        register = (row // 8) + 2 * (col // 8)
        return lane, f"a{register}.{col % 2}"

    def b_owner(k, n):  # B (16 x 8, "col": k along rows here)
        lane = n * 4 + (k % 8) // 2
        return lane, f"b{k // 8}.{k % 2}"

    def c_owner(row, col):  # C/D (16 x 8, FP32)
        lane = (row % 8) * 4 + col // 2
        return lane, f"c{2 * (row // 8) + col % 2}"

    draw(axes[0], 16, 16, a_owner, "A = 16 x 16 bf16 (Q or P): four 32-bit registers a0..a3\n"
         "per lane, two bf16 each (.0, .1)")
    draw(axes[1], 16, 8, b_owner, "B = 16 x 8 bf16 (K^T or V):\nb0, b1 per lane")
    draw(axes[2], 16, 8, c_owner, "C, D = 16 x 8 FP32 (S or O):\nc0..c3 per lane")
    axes[0].set_xlabel("k")
    axes[0].set_ylabel("m (row)")
    axes[1].set_xlabel("n")
    axes[1].set_ylabel("k")
    axes[2].set_xlabel("n")
    axes[2].set_ylabel("m (row)")
    figure.suptitle("mma.sync.m16n8k16: D = A B + C, one warp. Each cell: the lane that holds it "
                    "and the register (.0/.1: low/high bf16 half).\nLane 4g + t holds, in A and C, "
                    "rows g and g + 8, columns 2t, 2t + 1 (+8); in B, column g, rows 2t, 2t + 1 "
                    "(+8). Colour = g", fontsize=10)
    save(plt, figure, "05_mma_fragments.png")


def ldmatrix_lanes(plt, found):
    """05: ldmatrix.x4 loading the warp's 16 x 16 A tile of Q: which lane gives which row
    address, and which register each 8 x 8 matrix lands in."""
    from matplotlib.patches import Rectangle
    chunk = found["swizzle"]["CHUNK_ELEMENTS"]
    figure, axis = plt.subplots(figsize=(9, 6.4))
    colours = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]
    for lane in range(32):
        # The address the kernel gives: row lane % 16, column (lane / 16) * 8.
        row, col_chunk = lane % 16, lane // 16
        matrix = lane // 8
        axis.add_patch(Rectangle((col_chunk * chunk, row), chunk, 1, facecolor=colours[matrix],
                                 alpha=0.55, edgecolor="white"))
        axis.text(col_chunk * chunk + chunk / 2, row + 0.5, f"lane {lane}", ha="center",
                  va="center", fontsize=8)
    for matrix in range(4):
        row0, col0 = 8 * (matrix % 2), chunk * (matrix // 2)
        axis.add_patch(Rectangle((col0, row0), chunk, 8, fill=False, edgecolor="black",
                                 linewidth=1.6))
        left = matrix < 2
        axis.text(-0.3 if left else 2 * chunk + 0.3, row0 + 4,
                  f"matrix {matrix}\n(lanes {8 * matrix}-{8 * matrix + 7})\n-> register a{matrix}",
                  ha="right" if left else "left", va="center", fontsize=9,
                  color=colours[matrix], fontweight="bold")
    axis.set_xlim(-5, 2 * chunk + 5)
    axis.set_ylim(16, 0)
    axis.set_xticks([0, chunk, 2 * chunk])
    axis.set_yticks(range(0, 17, 4))
    axis.set_xlabel("column of the warp's 16 x 16 slice of Q (bf16); one box = one 16-byte row "
                    "of an 8 x 8 matrix")
    axis.set_ylabel("row")
    for spine in ("top", "right", "left"):
        axis.spines[spine].set_visible(False)
    axis.set_title("05: ldmatrix.x4 for the A operand. Each lane gives the shared-memory address "
                   "of one box\n(row lane % 16, column (lane / 16) · 8); the warp receives the "
                   "four matrices in the mma layout:\nregister i of lane l holds row l / 4, "
                   "columns 2(l % 4) and 2(l % 4) + 1 of matrix i", fontsize=9.5, loc="left")
    save(plt, figure, "05_ldmatrix_lanes.png")


def swizzle_banks(plt, found):
    """05: the bank groups of the 8 rows one ldmatrix 8x8 read touches, plain and swizzled."""
    from matplotlib.patches import Rectangle
    expression = found["swizzle"]["chunk_slot"]
    chunk = found["swizzle"]["CHUNK_ELEMENTS"]
    head_dim = 64
    chunks = head_dim // chunk

    def slot(row, column_chunk, swizzled):
        if not swizzled:
            return column_chunk
        return eval(expression, {}, {"row": row, "chunk": column_chunk})  # the header's formula

    figure, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    for axis, swizzled in zip(axes, (False, True)):
        for row in range(8):
            for column_chunk in range(chunks):
                position = slot(row, column_chunk, swizzled)
                read = column_chunk == 0
                axis.add_patch(Rectangle((position, row), 1, 1,
                                         facecolor="#c44e52" if read else "#dddddd",
                                         alpha=0.85 if read else 1.0, edgecolor="white",
                                         linewidth=1.5))
                axis.text(position + 0.5, row + 0.5, f"chunk {column_chunk}", ha="center",
                          va="center", fontsize=7.5, color="white" if read else "#333333")
        banks = sorted({4 * slot(row, 0, swizzled) for row in range(8)})
        axis.set_xlim(0, chunks)
        axis.set_ylim(8, 0)
        axis.set_xticks([k + 0.5 for k in range(chunks)])
        axis.set_xticklabels([f"banks\n{4 * k}-{4 * k + 3}" for k in range(chunks)], fontsize=7.5)
        axis.set_yticks([r + 0.5 for r in range(8)])
        axis.set_yticklabels([f"row {r}" for r in range(8)])
        ways = 8 // len(banks)
        axis.set_title(("plain: chunk c of every row in slot c" if not swizzled else
                        f"swizzled: chunk c of row r in slot {expression.replace('chunk', 'c').replace('row', 'r')}")
                       + f"\nreading chunk 0 of rows 0-7 (red): {len(banks)} bank group"
                       f"{'s' if len(banks) > 1 else ''}, "
                       + (f"{ways}-way conflict" if ways > 1 else "no conflict"),
                       fontsize=9.5, loc="left")
    figure.suptitle(f"05: where the 16-byte chunks of a bf16 tile row land in shared memory "
                    f"(D = {head_dim}: a row is 128 bytes, all 32 banks once)", fontsize=10)
    save(plt, figure, "05_swizzle_banks.png")


def pipeline(plt, found):
    """06: the cp.async schedule against stage 05's load-then-compute, per KV tile (schematic)."""
    from matplotlib.patches import Rectangle
    constants_06 = found["06_pipelined"]
    tiles = 4
    load, qk, softmax, pv = 1.2, 1.3, 1.1, 1.3
    figure, axes = plt.subplots(2, 1, figsize=(13, 4.8), sharex=True)

    def box(axis, x, y, width, label, colour):
        axis.add_patch(Rectangle((x, y - 0.32), width, 0.64, facecolor=colour, alpha=0.8,
                                 edgecolor="white"))
        axis.text(x + width / 2, y, label, ha="center", va="center", fontsize=7, color="white")

    # 05: load tile j, wait, compute tile j.
    x = 0.0
    for j in range(tiles):
        box(axes[0], x, 1, load, f"K{j}, V{j}", KEY_COLOUR)
        x += load + 0.15
        box(axes[0], x, 0, qk, f"S = Q K{j}^T", QUERY_COLOUR)
        box(axes[0], x + qk, 0, softmax, "softmax", STATE_COLOUR)
        box(axes[0], x + qk + softmax, 0, pv, f"O += P V{j}", VALUE_COLOUR)
        x += qk + softmax + pv + 0.15
    end_05 = x
    # 06: the prologue loads tile 0; each iteration issues tile j + 1 and then computes tile j.
    box(axes[1], 0, 1, load, "K0, V0", KEY_COLOUR)
    x = load + 0.15
    for j in range(tiles):
        if j + 1 < tiles:
            box(axes[1], x, 1, load, f"K{j + 1}, V{j + 1}", KEY_COLOUR)
        box(axes[1], x, 0, qk, f"S = Q K{j}^T", QUERY_COLOUR)
        box(axes[1], x + qk, 0, softmax, "softmax", STATE_COLOUR)
        box(axes[1], x + qk + softmax, 0, pv, f"O += P V{j}", VALUE_COLOUR)
        x += qk + softmax + pv
        axes[1].axvline(x, color="#333333", linewidth=0.8, linestyle=":")
        x += 0.15
    finish_timeline(plt, figure, axes, end_05, "06_pipeline.png",
                    ("05: load, wait, compute: the copy engine and the tensor cores take turns",
                     f"06: while tile j is computed, the cp.async group of tile j + 1 "
                     f"is in flight ({constants_06['K_BUFFERS']} K buffers, "
                     f"{constants_06['V_BUFFERS']} V buffer"
                     f"{'s' if constants_06['V_BUFFERS'] > 1 else ''}); "
                     "dotted: cp.async.wait_group 0 + __syncthreads"),
                    rows=("warps (mma, softmax)", "cp.async in flight"),
                    xlabel="time (schematic: lengths are not measured; the chapter's profile gives "
                           "the real stalls)")


def backward_loop(plt, found):
    """07: a block owns a KV tile and walks the query tiles; dK, dV stay in registers, dQ is
    added to an FP32 accumulator in device memory."""
    from matplotlib.patches import Rectangle, FancyArrowPatch
    constants_07 = found["07_backward"]
    block_q, block_kv = constants_07["BLOCK_Q_D128"], constants_07["BLOCK_KV"]
    length = 6 * block_kv
    q_tiles, kv_tiles = length // block_q, length // block_kv
    owner = 2  # the KV tile of the highlighted block
    figure, axis = plt.subplots(figsize=(11, 7))
    for row in range(q_tiles):
        for col in range(kv_tiles):
            x, y = col * block_kv, row * block_q
            skipped = x > (row + 1) * block_q - 1
            mine = col == owner and not skipped
            colour = "#eeeeee" if skipped else ("#f3c9a6" if mine else "white")
            axis.add_patch(Rectangle((x, y), block_kv, block_q, facecolor=colour,
                                     edgecolor="#555555", linewidth=0.8))
    axis.plot([0, length], [0, length], color=STATE_COLOUR, linewidth=1, linestyle="--")
    first_row = (owner * block_kv) // block_q
    column_x = owner * block_kv
    axis.add_patch(FancyArrowPatch((column_x + block_kv * 0.5, first_row * block_q + block_q * 0.2),
                                   (column_x + block_kv * 0.5, length - block_q * 0.2),
                                   arrowstyle="-|>", mutation_scale=16, color="#8c4a12",
                                   linewidth=2))
    axis.text(column_x - block_kv * 0.1, first_row * block_q + block_q * 0.5,
              "per visited tile, on chip:\nS = QKᵀ, P = exp(S - LSE),\ndP = dO Vᵀ, "
              "dS = P(dP − δ)", ha="right", va="center", fontsize=8, color="#8c4a12",
              bbox={"facecolor": "white", "edgecolor": "#8c4a12", "alpha": 0.95})
    # dK, dV: the owning block's registers, stored once.
    axis.add_patch(Rectangle((column_x, length + block_q * 0.5), block_kv, block_q * 0.9,
                             facecolor="#f3c9a6", edgecolor="#8c4a12", linewidth=1.2))
    axis.text(column_x + block_kv / 2, length + block_q * 0.95, "dK, dV", ha="center",
              va="center", fontsize=9, color="#8c4a12", fontweight="bold")
    axis.text(column_x + block_kv * 1.1, length + block_q * 0.95,
              "dK += dSᵀQ, dV += PᵀdO: registers for the\nwhole walk, stored once at its end",
              ha="left", va="center", fontsize=8, color="#8c4a12")
    # dQ: each visited query tile gets a partial dQ added to the FP32 accumulator.
    accumulator_x = length + block_kv * 1.4
    for row in range(q_tiles):
        axis.add_patch(Rectangle((accumulator_x, row * block_q), block_kv * 0.5, block_q,
                                 facecolor="#c6d7ee", edgecolor="#555555", linewidth=0.8))
        if row >= first_row:
            axis.add_patch(FancyArrowPatch((column_x + block_kv, row * block_q + block_q / 2),
                                           (accumulator_x, row * block_q + block_q / 2),
                                           arrowstyle="-|>", mutation_scale=8,
                                           color="#1a3d6d", linewidth=0.6, alpha=0.7))
    axis.text(accumulator_x + block_kv * 0.25, -block_q * 0.25,
              "dQ (FP32,\ndevice memory)", ha="center", va="bottom", fontsize=8.5, color="#1a3d6d")
    axis.text(accumulator_x + block_kv * 0.6, length / 2,
              "dQ += dS K from\nevery KV block:\nHopper: cp.reduce.\nasync.bulk;\nbefore: atomicAdd;\n"
              "then one kernel\nrounds it to bf16", fontsize=8, color="#1a3d6d", ha="left",
              va="center")
    axis.set_xlim(-2, accumulator_x + block_kv * 1.9)
    axis.set_ylim(length + block_q * 1.6, -block_q * 1.2)
    axis.set_aspect("equal")
    axis.set_xticks([k * block_kv for k in range(kv_tiles + 1)])
    axis.set_yticks([q * block_q for q in range(0, q_tiles + 1, 2)])
    axis.tick_params(labelsize=8)
    axis.set_xlabel(f"key index j  (one block per KV tile of {block_kv} keys, {constants_07['WARPS']} warps)")
    axis.set_ylabel(f"query index i  (tiles of {block_q} queries at D = 128)")
    axis.set_title("07: the backward's loop order, causal, one head. dK and dV sum over queries: "
                   "the block that owns the keys\nkeeps them. dQ sums over keys: every block "
                   "contributes, so it is gathered in device memory. Grey: above the diagonal, skipped",
                   fontsize=9.5, loc="left")
    save(plt, figure, "07_backward_loop.png")


# ---- the Hopper stages (08-12) ------------------------------------------------------------

def hopper_tiling(path, alias):
    """The template arguments of `using ALIAS = Tiling<...>;` in a Hopper stage's file."""
    match = re.search(rf"using {alias} = Tiling<([\d, ]+)>;", source(path))
    if not match:
        raise SystemExit(f"draw.py: the {alias} line of {path} changed: update the parser")
    return [int(value) for value in match.group(1).split(",")]


def expression(path, pattern):
    """The first group of `pattern` in `path` as written (an expression the picture evaluates)."""
    match = re.search(pattern, source(path))
    if not match:
        raise SystemExit(f"draw.py: '{pattern}' not found in {path}: update the parser")
    return match.group(1)


def operand_layout(path):
    """08's shared-memory operand layout: the swizzle of its tensor maps, the 64-element slab
    row, and what k_descriptor and v_descriptor pass to make_smem_descriptor."""
    text = source(path)
    swizzle = re.search(r"CU_TENSOR_MAP_SWIZZLE_(\d+)B", text)
    slab = re.search(r"constexpr uint32_t SLAB_ROW_BYTES = (\d+) \* sizeof\(bf16\);", text)
    k_step = re.search(r"k_tiles \+ \(stage \* SLABS \+ step / (\d+)\) \* BLOCK_KV \* 64 \+ "
                       r"\(step % \d+\) \* (\d+),\s*(\d+), (\d+) \* SLAB_ROW_BYTES\)", text)
    v_step = re.search(r"v_tiles \+ stage \* SLABS \* BLOCK_KV \* 64 \+ step \* (\d+) \* 64,\s*"
                       r"BLOCK_KV \* SLAB_ROW_BYTES, (\d+) \* SLAB_ROW_BYTES\)", text)
    if not (swizzle and slab and k_step and v_step):
        raise SystemExit(f"draw.py: the tensor map swizzle, SLAB_ROW_BYTES or the descriptors of "
                         f"{path} changed: update the parser")
    return {"TMA_SWIZZLE_BYTES": int(swizzle.group(1)), "SLAB_ELEMENTS": int(slab.group(1)),
            "K_STEPS_PER_SLAB": int(k_step.group(1)), "K_STEP_ELEMENTS": int(k_step.group(2)),
            "K_LEADING_BYTES": int(k_step.group(3)), "ATOM_ROWS": int(k_step.group(4)),
            "V_STEP_KEYS": int(v_step.group(1)), "V_ATOM_ROWS": int(v_step.group(2))}


def descriptor_fields():
    """Where make_smem_descriptor (common/hopper.cuh) puts each field of the 64-bit descriptor."""
    match = re.search(r"return \(\(address & 0x3FFFF\) >> (\d+)\) \| \(uint64_t\(leading_bytes >> \d+\) << "
                      r"(\d+)\) \|\s*\(uint64_t\(stride_bytes >> \d+\) << (\d+)\) \| \((\d+)ull << (\d+)\);",
                      source("common/hopper.cuh"))
    if not match:
        raise SystemExit("draw.py: make_smem_descriptor of common/hopper.cuh changed: update the parser")
    return {"UNIT_SHIFT": int(match.group(1)), "LEADING_AT": int(match.group(2)),
            "STRIDE_AT": int(match.group(3)), "SWIZZLE_MODE": int(match.group(4)),
            "SWIZZLE_AT": int(match.group(5))}


def progressive_convert(path, consumers):
    """11's conversion of dQ beside the main kernel's last rounds: the rounds from which it runs
    there, the arrivals a block counts in head_done, the conversion's block size, and the shape of
    the launch and of the waits the picture draws (checked, so that a changed design fails here)."""
    text = source(path)
    arrivals = expression(path, r"constexpr uint32_t HEAD_ARRIVALS = ([\w:]+);")
    if arrivals != "Config::CONSUMERS" and not arrivals.isdigit():
        raise SystemExit(f"draw.py: HEAD_ARRIVALS of {path} is {arrivals}: update the parser")
    shape = [r"int64_t\(batch_heads\) \* kv_tiles > int64_t\(PROGRESSIVE_MIN_ROUNDS - 1\) \* sms;",
             r"kv_tiles \* HEAD_ARRIVALS<Config>\)",  # the count a head's conversion waits for
             r"while \(load_acquire_gpu\(head_done \+ head\) < head_arrivals\) __nanosleep",
             r"if \(BESIDE && blockIdx\.x == gridDim\.x - 1\) wait_for_prior_grid\(\);",
             r"red_release_gpu_add\(head_done \+ block\.head, 1\);"]
    for pattern in shape:
        if not re.search(pattern, text):
            raise SystemExit(f"draw.py: '{pattern}' not found in {path}: the conversion beside the main "
                             "kernel changed: update 11_progressive_convert.png and the parser")
    return {"HEAD_ARRIVALS": consumers if arrivals == "Config::CONSUMERS" else int(arrivals),
            "PROGRESSIVE_MIN_ROUNDS": integer(path, r"constexpr int PROGRESSIVE_MIN_ROUNDS = (\d+);"),
            "CONVERT_THREADS": integer(path, r"constexpr int CONVERT_THREADS = (\d+);")}


def headline_shape(name):
    """A one-shape sweep of bench/sweeps.txt: [batch, heads, len_q, len_kv, head_dim, causal]."""
    match = re.search(rf"^{name}((?:\s+\d+){{6}})\s*$", source("bench/sweeps.txt"), re.MULTILINE)
    if not match:
        raise SystemExit(f"draw.py: the {name} line of bench/sweeps.txt changed: update the parser")
    return [int(field) for field in match.group(1).split()]


def hopper_constants(found):
    path = "08_wgmma_tma/attention.cu"
    head_dim, warpgroups, block_kv, stages = hopper_tiling(path, "Tiling128")
    found["08_wgmma_tma"] = {"HEAD_DIM": head_dim, "WARPGROUPS": warpgroups, "BLOCK_KV": block_kv,
                             "STAGES": stages}
    found["08_wgmma_tma"].update(operand_layout(path))
    found["descriptor"] = descriptor_fields()
    path = "09_warp_specialized/attention.cu"
    head_dim, consumers, block_kv, stages = hopper_tiling(path, "Tiling128")
    found["09_warp_specialized"] = {
        "CONSUMERS": consumers, "BLOCK_KV": block_kv, "STAGES": stages,
        "PRODUCER_REGISTERS": integer(path, r"PRODUCER_REGISTERS = (\d+);"),
        "CONSUMER_REGISTERS": integer(path, r"CONSUMER_REGISTERS = (\d+);"),
        "WARPS_PER_CONSUMER": integer(path, r"constexpr int CONSUMER_WARPS = (\d+) \* Config::CONSUMERS;"),
        "EMPTY_ARRIVALS": expression(path, r"mbarrier_init\(&k_empty\[stage\], (\w+)\);"),
        "FULL_PARITY": expression(path, r"const uint32_t full_parity = (\(kv_tile / STAGES\) % 2);"),
        "FREE_PARITY": expression(path, r"const uint32_t free_parity = (\(kv_tile / STAGES \+ 1\) % 2);")}
    path = "10_pingpong/attention.cu"
    found["10_pingpong"] = {"Tiling64": hopper_tiling(path, "Tiling64"),
                            "Tiling128": hopper_tiling(path, "Tiling128")}
    path = "11_hopper_backward/attention.cu"
    found["11_hopper_backward"] = {
        "CONSUMERS": integer(path, r"static constexpr int CONSUMERS = (\d+);\n    static constexpr int THREADS = 128 \* \(1 \+ CONSUMERS\);\n    static constexpr int BLOCK_KV = 64 \* CONSUMERS;"),
        "BLOCK_Q_D64": integer(path, r"static constexpr int BLOCK_Q = HEAD_DIM == 64 \? (\d+) : \d+;"),
        "BLOCK_Q_D128": integer(path, r"static constexpr int BLOCK_Q = HEAD_DIM == 64 \? \d+ : (\d+);"),
        "STAGES": integer(path, r"struct BackwardTiling \{[^}]*?STAGES = (\d+);"),
        "DQ_N_ONES": integer(path, r"static constexpr int DQ_N = SUMS_ROWS \? 64 \+ (\d+) : 64;")}
    found["11_hopper_backward"]["BLOCK_KV"] = 64 * found["11_hopper_backward"]["CONSUMERS"]
    path = "11_hopper_backward/dq_fixed_point.h"
    found["11_hopper_backward"]["FIXED_POINT_BITS"] = integer(path, r"constexpr int FIXED_POINT_BITS = (\d+);")
    found["11_hopper_backward"]["KV_BOUND_CHUNKS"] = integer(path, r"constexpr int KV_BOUND_CHUNKS = (\d+);")
    found["11_hopper_backward"].update(progressive_convert("11_hopper_backward/attention.cu",
                                                                  found["11_hopper_backward"]["CONSUMERS"]))
    found["bf16-headline"] = headline_shape("bf16-headline")
    path = "12_persistent/attention.cu"
    buffers = re.search(r"static_assert\(Tiling64::O_BUFFERS == (\d+) && Tiling128::O_BUFFERS == (\d+) "
                        r"&& Tiling128Causal::O_BUFFERS == (\d+)\);", source(path))
    if not buffers:
        raise SystemExit(f"draw.py: the O_BUFFERS static_assert of {path} changed: update the parser")
    found["12_persistent"] = {
        "Tiling64": hopper_tiling(path, "Tiling64"), "Tiling128": hopper_tiling(path, "Tiling128"),
        "Tiling128Causal": hopper_tiling(path, "Tiling128Causal"),
        "O_BUFFERS": {"Tiling64": int(buffers.group(1)), "Tiling128": int(buffers.group(2)),
                      "Tiling128Causal": int(buffers.group(3))},
        "SCHEDULE_SLOTS": integer(path, r"constexpr int SCHEDULE_SLOTS = (\d+);"),
        "PRODUCER_REGISTERS": [integer(path, r"PRODUCER_REGISTERS = CONSUMERS == 2 \? (\d+) : \d+;"),
                               integer(path, r"PRODUCER_REGISTERS = CONSUMERS == 2 \? \d+ : (\d+);")],
        "O_FULL_ARRIVALS": integer(path, r"mbarrier_init\(&o_full\[buffer\], (\d+)\);"),
        "COUNTED_FROM": integer(path, r"return tiles >= int64_t\(causal \? (\d+) : \d+\) \* multiprocessors;"),
        "COUNTED_FROM_NONCAUSAL": integer(path, r"return tiles >= int64_t\(causal \? \d+ : (\d+)\) \* multiprocessors;"),
    }


def flow_box(axis, x, y, width, height, text, colour, text_colour="white", size=8.5):
    from matplotlib.patches import FancyBboxPatch
    axis.add_patch(FancyBboxPatch((x, y), width, height, boxstyle="round,pad=0.02,rounding_size=0.08",
                                  facecolor=colour, edgecolor="#333333", linewidth=0.6))
    axis.text(x + width / 2, y + height / 2, text, ha="center", va="center", fontsize=size,
              color=text_colour, wrap=True)


def flow_arrow(axis, start, end, label="", colour="#333333", offset=(0, 0.12), size=7.5, style="-|>"):
    from matplotlib.patches import FancyArrowPatch
    axis.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=11, color=colour,
                                   linewidth=1.0, shrinkA=2, shrinkB=2))
    if label:
        axis.text((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1], label,
                  ha="center", va="bottom", fontsize=size, color="#222222", family="monospace")


def blank(plt, width, height, xmax, ymax):
    figure, axis = plt.subplots(figsize=(width, height))
    axis.set_xlim(0, xmax)
    axis.set_ylim(0, ymax)
    axis.axis("off")
    return figure, axis


def data_path_08(plt, found):
    """08: one tile's way from device memory to the O accumulator, with the instruction at
    each step."""
    c = found["08_wgmma_tma"]
    figure, axis = blank(plt, 13, 5.4, 13, 6.2)
    grey = "#8c8c8c"
    flow_box(axis, 0.2, 4.6, 2.2, 1.0, "device memory\nQ, K, V\n[B·H][len][D] bf16", grey)
    flow_box(axis, 3.6, 4.6, 2.6, 1.0, f"TMA: boxes of [rows][64]\n128-byte swizzle\nrows past len -> 0",
             "#6a51a3")
    ring = f"shared memory\nQ tile + ring of {c['STAGES']} K/V stages\n(one mbarrier each)"
    flow_box(axis, 7.4, 4.6, 3.0, 1.0, ring, KEY_COLOUR)
    flow_arrow(axis, (2.4, 5.1), (3.6, 5.1), "cp.async\n.bulk.tensor", offset=(0, 0.08))
    flow_arrow(axis, (6.2, 5.1), (7.4, 5.1), "complete\n_tx", offset=(0, 0.08))
    flow_box(axis, 10.9, 4.6, 1.9, 1.0, "warps wait\nfor the phase", "#3b3b3b")
    flow_arrow(axis, (10.4, 5.1), (10.9, 5.1))
    axis.text(11.85, 4.35, "mbarrier.try_wait.parity", ha="center", fontsize=7.5, family="monospace")
    flow_box(axis, 7.4, 2.6, 3.0, 1.0, f"S = Q Kᵀ  (64 × {c['BLOCK_KV']} per warpgroup)\n"
             "FP32 in registers", QUERY_COLOUR)
    flow_arrow(axis, (8.9, 4.6), (8.9, 3.6), "wgmma ... .ss (descriptors)", offset=(1.35, -0.15))
    flow_box(axis, 3.6, 2.6, 2.6, 1.0, "online softmax\nm, l, alpha\nP -> bf16 fragments", STATE_COLOUR)
    flow_arrow(axis, (7.4, 3.1), (6.2, 3.1), "wait_group 0", offset=(0, 0.08))
    flow_box(axis, 3.6, 0.5, 2.6, 1.0, f"O += P V  (64 × {c['HEAD_DIM']})\nFP32 in registers",
             VALUE_COLOUR)
    flow_arrow(axis, (4.9, 2.6), (4.9, 1.5), "wgmma ... .rs\n(P from registers)", offset=(-0.85, -0.25))
    flow_arrow(axis, (7.6, 4.6), (6.2, 1.4), "", colour=VALUE_COLOUR)
    axis.text(7.0, 1.6, "wgmma reads V through a\ntransposed (MN-major) descriptor", fontsize=7.5, color=VALUE_COLOUR)
    flow_box(axis, 0.2, 0.5, 2.4, 1.0, "O / l -> bf16\nLSE", grey)
    flow_arrow(axis, (3.6, 1.0), (2.6, 1.0), "after the\nlast tile", offset=(0, 0.08))
    axis.set_title(f"Stage 08, one block: {c['WARPGROUPS']} warpgroups of 64 query rows, "
                   f"D = {c['HEAD_DIM']}, K/V tiles of {c['BLOCK_KV']} keys", fontsize=10, loc="left")
    save(plt, figure, "08_data_path.png")


def swizzle_descriptor_08(plt, found):
    """08: the 128-byte swizzle of one atom as TMA writes it, what one wgmma k-step reads of a
    K tile (K-major) and of a V tile (MN-major), and the descriptor's fields for both."""
    import textwrap
    from matplotlib.patches import Rectangle, FancyArrowPatch
    c, d = found["08_wgmma_tma"], found["descriptor"]
    chunk_bytes = 16  # the swizzle permutes 16-byte chunks: eight bf16
    slab, rows = c["SLAB_ELEMENTS"], c["ATOM_ROWS"]
    row_bytes = 2 * slab
    chunks = row_bytes // chunk_bytes
    if c["TMA_SWIZZLE_BYTES"] != row_bytes or chunks != rows or c["V_ATOM_ROWS"] != rows:
        raise SystemExit("draw.py: 08_swizzle_descriptor.png draws the 128-byte swizzle of 64-element "
                         "rows: update it")
    atom_bytes = rows * row_bytes
    step_bytes = 2 * c["K_STEP_ELEMENTS"]
    step_chunks = step_bytes // chunk_bytes
    steps = c["K_STEPS_PER_SLAB"]
    slabs = c["HEAD_DIM"] // slab
    v_step_bytes = c["V_STEP_KEYS"] * row_bytes
    leading_v = c["BLOCK_KV"] * row_bytes
    first_key, last_key = c["V_STEP_KEYS"], 2 * c["V_STEP_KEYS"] - 1
    first_col, last_col = c["K_STEP_ELEMENTS"], 2 * c["K_STEP_ELEMENTS"] - 1

    def slot(row, chunk):  # where TMA stores chunk `chunk` of row `row`: bits 4-6 ^= bits 7-9
        return chunk ^ (row % rows)

    def wrap(text, width=52):
        return "\n".join(textwrap.fill(part, width) for part in text.split("\n"))

    palette = ["#4c72b0", "#dd8452", "#55a868", "#8172b3"]
    red, blue = "#b03030", "#1a3d6d"
    figure = plt.figure(figsize=(15.5, 12.2))
    grid = figure.add_gridspec(3, 3, height_ratios=[1.6, 0.3, 0.9], width_ratios=[1.2, 1, 1],
                               hspace=0.22, wspace=0.22, left=0.09, right=0.98, top=0.885, bottom=0.02)
    atom, k_tile, v_tile = (figure.add_subplot(grid[0, i]) for i in range(3))
    note = figure.add_subplot(grid[1, :])
    bits = figure.add_subplot(grid[2, :])

    # One atom: eight rows of eight chunks, each cell where TMA puts it, coloured by k-step.
    for row in range(rows):
        for chunk in range(chunks):
            step = chunk // step_chunks
            x = slot(row, chunk)
            mine = step == 1
            atom.add_patch(Rectangle((x, row), 1, 1, facecolor=palette[step % 4],
                                     alpha=0.9 if mine else 0.35, edgecolor="white", linewidth=1.2))
            atom.text(x + 0.5, row + 0.5, f"{8 * chunk}-{8 * chunk + 7}", ha="center", va="center",
                      fontsize=7, color="white" if mine else "#222222",
                      fontweight="bold" if mine else "normal")
    atom.add_patch(FancyArrowPatch((step_chunks, -0.9), (step_chunks, 0.05), arrowstyle="-|>",
                                   mutation_scale=10, color=red, linewidth=1.3))
    atom.text(step_chunks, -1.0, f"k-step 1's descriptor starts here:\natom base + {step_bytes} B",
              ha="center", va="bottom", fontsize=8, color=red)
    atom.set_xlim(0, chunks)
    atom.set_ylim(rows, -2.4)
    atom.set_xticks([k + 0.5 for k in range(chunks)])
    atom.set_xticklabels([f"{chunk_bytes * k}" for k in range(chunks)], fontsize=7.5)
    atom.set_xlabel(f"byte in the {row_bytes}-byte row (eight 16-byte chunks)", fontsize=8.5)
    atom.set_yticks([r + 0.5 for r in range(rows)])
    atom.set_yticklabels([f"row {r}  (+{row_bytes * r} B)" for r in range(rows)], fontsize=7.5)
    for spine in atom.spines.values():
        spine.set_visible(False)
    atom.set_title(wrap(f"A. One {atom_bytes}-byte atom ({rows} rows × {slab} bf16) as TMA writes it: "
                        f"chunk c of row r lands at position c XOR r. A cell names the columns it "
                        f"holds; its colour, the k-step ({c['K_STEP_ELEMENTS']} columns) that reads "
                        f"it; bold: k-step 1, columns {first_col}-{last_col}"),
                   fontsize=9, loc="left")

    # A tile as stored: SLABS slabs of [BLOCK_KV][64] side by side, atoms of 8 rows. Only the
    # first four atoms are drawn; the others follow every stride bytes.
    shown_atoms = 4
    shown_rows = shown_atoms * rows
    gap = 1.4

    def tile(axis, reads, title):
        for s in range(slabs):
            x0 = s * (chunks + gap)
            for row in range(shown_rows):
                for chunk in range(chunks):
                    hit = reads(s, row, chunk)
                    axis.add_patch(Rectangle((x0 + slot(row, chunk), row), 1, 1,
                                             facecolor=palette[1] if hit else "#eeeeee",
                                             edgecolor="white", linewidth=0.4))
            for a in range(shown_atoms + 1):
                axis.plot([x0, x0 + chunks], [a * rows, a * rows], color="#333333", linewidth=0.9)
            for edge in (x0, x0 + chunks):
                axis.plot([edge, edge], [0, shown_rows], color="#333333", linewidth=0.9)
            axis.text(x0 + chunks / 2, -0.6, f"slab {s}\ncolumns {slab * s}-{slab * s + slab - 1}",
                      ha="center", va="bottom", fontsize=8)
        axis.text(slabs * (chunks + gap) / 2 - gap / 2, shown_rows + 1.0,
                  f"⋮  keys {shown_rows}-{c['BLOCK_KV'] - 1}: {c['BLOCK_KV'] // rows - shown_atoms} "
                  f"more atoms in each slab", ha="center", va="top", fontsize=7.5, color="#555555")
        axis.set_xlim(-3.6, slabs * (chunks + gap) - gap + 0.3)
        axis.set_ylim(shown_rows + 3.2, -3.2)
        axis.set_yticks([a * rows + rows / 2 for a in range(shown_atoms)])
        axis.set_yticklabels([f"atom {a}\nkeys {a * rows}-{a * rows + rows - 1}"
                              for a in range(shown_atoms)], fontsize=7)
        axis.tick_params(axis="y", length=0)
        axis.set_xticks([])
        for spine in axis.spines.values():
            spine.set_visible(False)
        axis.set_title(wrap(title, 46), fontsize=9, loc="left")

    def span(axis, start, end, label, colour):
        axis.add_patch(FancyArrowPatch(start, end, arrowstyle="<|-|>", mutation_scale=9,
                                       color=colour, linewidth=1.2, shrinkA=0, shrinkB=0))
        axis.text(start[0] - 0.3, (start[1] + end[1]) / 2, label, fontsize=7.5, color=colour,
                  ha="right", va="center",
                  bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.9, "pad": 1})

    # K, K-major (B of S = Q K^T): k-step 1 reads columns 16-31 of every key, in slab 0.
    tile(k_tile, lambda s, row, chunk: s == 0 and chunk // step_chunks == 1,
         f"B. A K tile, K-major (the B of S = Q Kᵀ). k-step 1 reads columns {first_col}-{last_col} "
         f"of all {c['BLOCK_KV']} keys: two chunks of every row of the {c['BLOCK_KV'] // rows} atoms "
         f"of slab 0, wherever the XOR put them. k-steps {steps}-{2 * steps - 1} read slab 1")
    span(k_tile, (-0.35, rows * 0.5), (-0.35, rows * 1.5), f"stride\n{atom_bytes} B", red)
    # V, MN-major (B of O = P V, transposed): k-step 1 reads keys 16-31 (two atoms), every column.
    tile(v_tile, lambda s, row, chunk: first_key <= row <= last_key,
         f"C. A V tile, MN-major (the B of O = P V, read transposed). k-step 1 reads keys "
         f"{first_key}-{last_key}, two whole atoms (start + {v_step_bytes:,} B), in both slabs: "
         f"all {c['HEAD_DIM']} output columns")
    span(v_tile, (-0.35, first_key + rows * 0.5), (-0.35, first_key + rows * 1.5),
         f"stride\n{atom_bytes} B", red)
    v_tile.add_patch(FancyArrowPatch((chunks * 0.5, first_key - 0.7), (chunks + gap + chunks * 0.5,
                                                                      first_key - 0.7),
                                     arrowstyle="-|>", mutation_scale=9, color=blue, linewidth=1.3,
                                     connectionstyle="arc3,rad=-0.25"))
    v_tile.text(chunks + gap / 2, first_key - 3.0, f"leading {leading_v:,} B\n(BLOCK_KV × {row_bytes} B)",
                ha="center", va="center", fontsize=7.5, color=blue,
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.9, "pad": 1})

    # Why the 32-byte step inside an atom is legal.
    note.axis("off")
    note.text(0.0, 1.0,
              f"Why k-step 1 may start {step_bytes} bytes into the atom: the hardware swizzles every "
              f"address it forms, not the start address. For row r and chunk j (0 or 1) of the "
              f"step it forms\n    address = atom base + {step_bytes} + {row_bytes}·r + "
              f"{chunk_bytes}·j,   whose bits 7-9 are r and bits 4-6 are {step_chunks} + j,\nthen "
              f"XORs bits 4-6 with bits 7-9 and reads position ({step_chunks} + j) XOR r: the cell in "
              f"which TMA, applying the same XOR to the same bits, wrote columns {first_col} + 8j "
              f"to {first_col + 7} + 8j of row r (bold in A).\nThis holds because the atom starts on "
              f"a {atom_bytes}-byte boundary (bits 7-9 number its rows from 0) and the k-step offsets "
              f"0, {step_bytes}, {2 * step_bytes}, {3 * step_bytes} never reach bit 7.",
              fontsize=8.5, va="top", ha="left", transform=note.transAxes, linespacing=1.5)

    # The 64-bit descriptor: the fields as make_smem_descriptor packs them, to scale, and what
    # stage 08 puts in them for k-step 1 of K and of V.
    unit = 1 << d["UNIT_SHIFT"]
    width = 14
    fields = [("start address ÷ 16", 0, width - 1, "#c6d7ee",
               f"(k_tiles + {step_bytes}) ÷ 16", f"(v_tiles + {v_step_bytes:,}) ÷ 16"),
              ("leading byte offset ÷ 16", d["LEADING_AT"], d["LEADING_AT"] + width - 1, "#d5e8d4",
               f"{c['K_LEADING_BYTES']} ÷ 16 = {c['K_LEADING_BYTES'] // unit}  (not used)",
               f"{leading_v:,} ÷ 16 = {leading_v // unit:,}  (slab 0 → slab 1)"),
              ("stride byte offset ÷ 16", d["STRIDE_AT"], d["STRIDE_AT"] + width - 1, "#f8cecc",
               f"{atom_bytes:,} ÷ 16 = {atom_bytes // unit}  (keys 0-7 → 8-15)",
               f"{atom_bytes:,} ÷ 16 = {atom_bytes // unit}  (keys 0-7 → 8-15)"),
              ("base offset", 49, 51, "#eeeeee", "0  (atoms 1024-byte aligned)", "0"),
              ("swizzle mode", d["SWIZZLE_AT"], 63, "#e1d5e7",
               f"{d['SWIZZLE_MODE']}  (128-byte swizzle)", f"{d['SWIZZLE_MODE']}  (128-byte swizzle)")]
    taken = {bit for _, low, high, *_ in fields for bit in range(low, high + 1)}
    scale = 0.9  # one bit, in axis units
    for bit in range(64):
        x = (63 - bit) * scale
        colour = next((f[3] for f in fields if f[1] <= bit <= f[2]), "#fafafa")
        bits.add_patch(Rectangle((x, 6.2), scale, 1, facecolor=colour,
                                 edgecolor="#bbbbbb" if bit not in taken else colour, linewidth=0.4))
    for name, low, high, colour, _, _ in fields:
        x0, x1 = (63 - high) * scale, (64 - low) * scale
        bits.add_patch(Rectangle((x0, 6.2), x1 - x0, 1, fill=False, edgecolor="#333333", linewidth=0.9))
        bits.text((x0 + x1) / 2, 7.35, f"{high}-{low}", ha="center", va="bottom", fontsize=7,
                  color="#444444")
        if high - low >= 10:
            bits.text((x0 + x1) / 2, 6.7, name, ha="center", va="center", fontsize=7.5)
    bits.text(-0.4, 6.7, "bit 63", ha="right", va="center", fontsize=7.5, color="#555555")
    bits.text(64 * scale + 0.4, 6.7, "bit 0", ha="left", va="center", fontsize=7.5, color="#555555")
    columns = (0.0, 13.0, 20.5, 41.0)
    headers = ("field", "bits", "k_descriptor(stage 0, k-step 1): K-major",
               "v_descriptor(stage 0, k-step 1): MN-major")
    for x, header in zip(columns, headers):
        bits.text(x, 5.2, header, ha="left", va="center", fontsize=8, fontweight="bold")
    for line, (name, low, high, colour, k_value, v_value) in enumerate(fields):
        y = 4.3 - 0.9 * line
        bits.add_patch(Rectangle((-0.3, y - 0.38), 58.5, 0.76, facecolor=colour, alpha=0.55,
                                 edgecolor="none"))
        for x, value in zip(columns, (name, f"{low}-{high}", k_value, v_value)):
            bits.text(x, y, value, ha="left", va="center", fontsize=8,
                      family="monospace" if x > 15 else None)
    bits.set_xlim(-3, 64 * scale + 3)
    bits.set_ylim(0.3, 8.0)
    bits.axis("off")
    bits.set_title(wrap("D. The wgmma matrix descriptor, as make_smem_descriptor (common/hopper.cuh) "
                        "packs it. The three byte quantities are stored ÷ 16, so each must be a "
                        "multiple of 16 bytes; the 14-bit start address covers 256 KiB, all of an "
                        "SM's shared memory. Grey bits are 0.", 160),
                   fontsize=9, loc="left")
    figure.suptitle(f"Stage 08's operands in shared memory: the {row_bytes}-byte swizzle that TMA "
                    f"writes and wgmma reads, and the descriptors that tell wgmma where to read "
                    f"(HEAD_DIM = {c['HEAD_DIM']}, BLOCK_KV = {c['BLOCK_KV']})",
                    fontsize=11, x=0.02, ha="left")
    save(plt, figure, "08_swizzle_descriptor.png")


def warp_roles_09(plt, found):
    """09: the producer warpgroup, the consumers, and the full/empty barrier pairs of the ring.
    Every consumer reads every stage (tile j is in stage j mod STAGES for all of them), and a
    stage is free again only when every consumer warp has arrived on its empty barriers."""
    from matplotlib.patches import Rectangle
    c = found["09_warp_specialized"]
    consumer_warps = 4 * c["CONSUMERS"]
    figure, axis = blank(plt, 13, 6.0, 13, 6.9)
    flow_box(axis, 0.2, 2.6, 2.8, 1.6, f"producer warpgroup\n(one thread issues TMA)\n"
             f"setmaxnreg.dec -> {c['PRODUCER_REGISTERS']}", "#6a51a3")
    axis.add_patch(Rectangle((4.3, 1.2), 3.4, 4.9, facecolor="none", edgecolor="#333333",
                             linestyle="--", linewidth=0.8))
    axis.text(5.9, 6.25, f"shared-memory ring: tile j in stage j mod {c['STAGES']}", ha="center",
              fontsize=8.5)
    height = 4.3 / c["STAGES"]
    stage_centres = []
    for stage in range(c["STAGES"]):
        y = 5.9 - (stage + 1) * height + 0.1
        flow_box(axis, 4.5, y, 3.0, height - 0.3, f"stage {stage}: K tile, V tile\n"
                 "barriers full[K], full[V]\nempty[K], empty[V]", KEY_COLOUR, size=8)
        stage_centres.append(y + (height - 0.3) / 2)
    flow_arrow(axis, (3.0, 3.6), (4.3, 3.6), "wait empty,\nexpect_tx,\ncopy", offset=(0, 0.1))
    # Every consumer waits on every stage's full barriers and arrives on its empty ones.
    consumer_height = min(1.5, 4.3 / c["CONSUMERS"] - 0.3)
    consumer_centres = []
    for consumer in range(c["CONSUMERS"]):
        y = 5.9 - (consumer + 1) * (4.3 / c["CONSUMERS"]) + 0.1
        flow_box(axis, 10.0, y, 2.9, consumer_height,
                 f"consumer {consumer}: rows {64 * consumer}-{64 * consumer + 63}\n"
                 f"wgmma + softmax on every tile\nsetmaxnreg.inc -> {c['CONSUMER_REGISTERS']}",
                 QUERY_COLOUR, size=8)
        consumer_centres.append(y + consumer_height / 2)
    for stage_y in stage_centres:
        for consumer_y in consumer_centres:
            flow_arrow(axis, (7.5, stage_y + 0.22), (10.0, consumer_y + 0.22))
            flow_arrow(axis, (10.0, consumer_y - 0.22), (7.5, stage_y - 0.22), colour=STATE_COLOUR)
    axis.text(8.75, 6.25, "wait full[K], full[V]", ha="center", fontsize=7.5, family="monospace")
    axis.text(8.75, 6.0, "every consumer, every stage", ha="center", fontsize=7.5)
    axis.text(8.75, 1.05, "arrive empty[K], empty[V]", ha="center", va="top", fontsize=7.5,
              family="monospace", color=STATE_COLOUR)
    axis.text(8.75, 0.82, f"lane 0 of each of the {consumer_warps} consumer warps;\n"
              f"the stage is free after all {consumer_warps}", ha="center", va="top", fontsize=7.5,
              color=STATE_COLOUR)
    axis.text(1.6, 2.0, "waits on empty with the parity\nof the stage's previous pass:\n"
              "on the first pass it is free", fontsize=8, ha="center", va="top")
    flow_box(axis, 0.2, 0.0, 6.2, 0.7, "epilogue: O -> shared memory (swizzled), fence.proxy.async, "
             "bar.sync,\none TMA store per consumer", "#3b3b3b", size=7.5)
    axis.set_title(f"Stage 09, one block: a producer, {c['CONSUMERS']} consumers, a ring of "
                   f"{c['STAGES']} stages of {c['BLOCK_KV']} keys; every consumer reads every stage",
                   fontsize=10, loc="left")
    save(plt, figure, "09_warp_roles.png")


def barrier_phases_09(plt, found):
    """09: the phases of a ring's full and empty barriers in time, and the parity each wait
    names (schematic durations; the parities are the kernel's expressions)."""
    from matplotlib.patches import Rectangle
    c = found["09_warp_specialized"]
    stages = c["STAGES"]
    warps = c["WARPS_PER_CONSUMER"] * c["CONSUMERS"]
    tiles = 3 * stages

    def parity(expression, kv_tile):  # the kernel's expression, C integer division
        return eval(expression.replace("/", "//"), {}, {"kv_tile": kv_tile, "STAGES": stages})

    copy, issue, work = 1.3, 0.55, 3.0  # schematic: TMA latency, the producer's issue, a tile's use
    producer_time, consumer_time = 0.1, 0.0
    full_done, empty_done, producer, consumer = {}, {}, [], []
    for j in range(tiles):
        stage = j % stages
        reach = producer_time
        released = empty_done.get(j - stages, 0.0)
        passed = max(reach, released)
        producer.append((j, stage, reach, passed))
        full_done[j] = passed + issue + copy
        producer_time = passed + issue + 0.05
        start = max(consumer_time, full_done[j])
        consumer.append((j, stage, consumer_time, start))
        empty_done[j] = start + work
        consumer_time = empty_done[j]
    end = consumer_time + 0.3

    rows = {"producer": 5, "full0": 4, "full1": 3, "consumers": 2, "empty0": 1, "empty1": 0}
    if stages != 2:
        raise SystemExit("draw.py: 09_barrier_phases.png draws a ring of two stages: update it")
    parity_colour = {0: "#dbe7f5", 1: "#fbe0c8"}
    figure, axis = plt.subplots(figsize=(15, 7.8))

    def phases(row, completions, total, what):
        edges = [0.0] + completions + [end]
        for phase in range(len(edges) - 1):
            x0, x1 = edges[phase], edges[phase + 1]
            axis.add_patch(Rectangle((x0, row - 0.3), x1 - x0, 0.6, facecolor=parity_colour[phase % 2],
                                     edgecolor="#999999", linewidth=0.5))
            if x1 - x0 > 3.2:
                axis.text((x0 + x1) / 2, row + 0.12, f"phase {phase} in progress",
                          ha="center", va="center", fontsize=7.5)
                axis.text((x0 + x1) / 2, row - 0.14, f"(parity {phase % 2}) {what}", ha="center",
                          va="center", fontsize=6.8, color="#444444")
            elif x1 - x0 > 0.8:
                axis.text((x0 + x1) / 2, row, f"phase {phase}\n(parity {phase % 2})",
                          ha="center", va="center", fontsize=7, linespacing=1.1)
        for phase, t in enumerate(completions):
            axis.plot([t, t], [row - 0.36, row + 0.36], color="#222222", linewidth=1.6)
            axis.text(t + 0.05, row + 0.38, f"phase {phase} done", fontsize=6.8, ha="left",
                      va="bottom", color="#222222")

    for stage in range(stages):
        phases(rows[f"full{stage}"], [full_done[j] for j in range(stage, tiles, stages)], 1,
               "waits for 1 arrival + the bytes")
        phases(rows[f"empty{stage}"], [empty_done[j] for j in range(stage, tiles, stages)], warps,
               f"waits for {warps} arrivals")

    def box(row, x0, x1, label, colour, text_colour="white", size=7.2):
        axis.add_patch(Rectangle((x0, row - 0.3), x1 - x0, 0.6, facecolor=colour, edgecolor="white"))
        axis.text((x0 + x1) / 2, row, label, ha="center", va="center", fontsize=size, color=text_colour,
                  linespacing=1.1)

    waiting = "#b0b0b0"
    row = rows["producer"]
    for j, stage, reach, passed in producer:
        p = parity(c["FREE_PARITY"], j)
        if passed - reach > 0.2:
            box(row, reach, passed, f"wait empty[{stage}], parity {p}", waiting, "#222222")
        else:
            axis.annotate(f"wait empty[{stage}], parity {p}: returns at once", (reach, row + 0.3),
                          xytext=(reach + 0.3 * j, row + 0.55 + 0.3 * j), fontsize=6.8,
                          ha="left", va="bottom",
                          arrowprops={"arrowstyle": "-", "color": "#555555", "linewidth": 0.6})
        box(row, passed, passed + issue, f"tile\n{j}", "#6a51a3")
        # expect_tx and the copies now; the phase completes when the last byte has landed.
        target = rows[f"full{stage}"]
        axis.annotate("", (full_done[j], target + 0.32), (passed + issue / 2, row - 0.3),
                      arrowprops={"arrowstyle": "-|>", "color": "#6a51a3", "linewidth": 0.8,
                                  "shrinkA": 0, "shrinkB": 0})
    row = rows["consumers"]
    for j, stage, reach, start in consumer:
        p = parity(c["FULL_PARITY"], j)
        if start - reach > 0.2:
            box(row, reach, start, f"wait\nfull[{stage}]\nparity {p}", waiting, "#222222", 6.8)
        box(row, start, empty_done[j], f"tile {j} in stage {stage}\n(waited on full[{stage}], "
            f"parity {p})", KEY_COLOUR)
        axis.annotate("", (empty_done[j], rows[f"empty{stage}"] + 0.3), (empty_done[j] - 0.02, row - 0.3),
                      arrowprops={"arrowstyle": "-|>", "color": STATE_COLOUR, "linewidth": 0.8,
                                  "shrinkA": 0, "shrinkB": 0})
    axis.set_xlim(-0.2, end)
    axis.set_ylim(-0.7, 6.2)
    axis.set_yticks(list(rows.values()))
    axis.set_yticklabels(["producer\n(one thread)", "full[0]", "full[1]",
                          f"consumers\n({warps} warps)", "empty[0]", "empty[1]"], fontsize=8.5)
    axis.set_xticks([])
    axis.set_xlabel("time (schematic: the durations are made up; the parities are the kernel's "
                    "expressions, evaluated tile by tile)", fontsize=8.5)
    for spine in ("top", "right"):
        axis.spines[spine].set_visible(False)
    axis.set_title(f"Stage 09's ring of {stages} stages in time, every phase of its barriers. Tile j "
                   f"uses stage j mod {stages}; the consumers wait on full with parity "
                   f"{c['FULL_PARITY']},\nthe producer waits on empty with parity "
                   f"{c['FREE_PARITY']}. Purple arrows: the copy engine's last byte lands and "
                   f"completes the full phase; red arrows: the last of the {warps} consumer warps "
                   f"arrives.\nColour: the parity of the phase in progress. A wait on parity p "
                   f"returns once phase p (mod 2) has completed, that is, while the bar it waits on "
                   f"has the other colour.\nA fresh barrier counts the phase before phase 0 "
                   f"(parity 1) as complete, so the producer's first {stages} waits return at once. "
                   f"One full/empty pair per stage is drawn; 09 has one for K (k_full, k_empty) and "
                   f"one for V.", fontsize=9, loc="left", linespacing=1.4)
    save(plt, figure, "09_barrier_phases.png")


def finish_timeline(plt, figure, axes, end, name, titles,
                    rows=("tensor cores", "consumer 1", "consumer 0"),
                    xlabel="time (schematic: durations are illustrative, not measured; the "
                           "chapter's profile has the real numbers)"):
    """The panels of a schematic timeline (06, 10, 11): rows bottom to top, titles, time."""
    for axis, title in zip(axes, titles):
        axis.set_yticks(list(range(len(rows))))
        axis.set_yticklabels(list(rows))
        axis.set_ylim(-0.6, len(rows) - 0.4)
        axis.set_title(title, fontsize=9.5, loc="left")
        for spine in ("top", "right"):
            axis.spines[spine].set_visible(False)
    axes[-1].set_xlim(0, end + 0.2)
    axes[-1].set_xticks([])
    axes[-1].set_xlabel(xlabel)
    save(plt, figure, name)


def pingpong_10(plt, found):
    """10 against 09: when each consumer's GEMMs and softmax run (schematic). Stage 10 twice:
    at D = 64, where a consumer waits for both of its GEMMs before its softmax (the compiled
    order, chapter 10, "What the compiler makes of it"), and at D = 128, where the softmax is
    called in both arms of the mask branch and ptxas keeps it between the two waits: the
    softmax of S_{j+1} also runs under the consumer's own P_j V_j."""
    from matplotlib.patches import Rectangle
    gemm, softmax, tiles = 1.0, 1.3, 3  # one consumer's S (or PV) GEMM; its softmax of a tile
    figure, axes = plt.subplots(3, 1, figsize=(13, 8.2), sharex=True)
    figure.subplots_adjust(hspace=0.5)

    def box(axis, x, y, width, label, colour, alpha=0.85):
        axis.add_patch(Rectangle((x, y - 0.32), width, 0.64, facecolor=colour, alpha=alpha,
                                 edgecolor="white"))
        axis.text(x + width / 2, y, label, ha="center", va="center", fontsize=7, color="white")

    wait = "#b0b0b0"
    # 09: both consumers issue S together, wait, compute the softmax together, issue P V
    # together, wait. The tensor cores run both consumers' GEMMs, then idle during the softmax.
    x = 0.0
    for j in range(tiles):
        for consumer in range(2):
            box(axes[0], x, 2 - consumer, 2 * gemm, f"wait for S{j}", wait)
            box(axes[0], x + 2 * gemm, 2 - consumer, softmax, "softmax", STATE_COLOUR)
            box(axes[0], x + 2 * gemm + softmax, 2 - consumer, 2 * gemm, f"wait for PV{j}", wait)
        box(axes[0], x, 0, gemm, f"S{j} c0", QUERY_COLOUR)
        box(axes[0], x + gemm, 0, gemm, f"S{j} c1", QUERY_COLOUR)
        box(axes[0], x + 2 * gemm + softmax, 0, gemm, f"PV{j} c0", VALUE_COLOUR)
        box(axes[0], x + 3 * gemm + softmax, 0, gemm, f"PV{j} c1", VALUE_COLOUR)
        x += 4 * gemm + softmax
    end = x
    # 10: a consumer issues S_{j+1} and P_j V_j together on its turn, then computes the softmax
    # of S_{j+1} while the other consumer's GEMMs run. At D = 64 it first waits for both GEMMs
    # (middle panel); at D = 128 it waits for S_{j+1} only and overlaps the softmax with its
    # own P_j V_j too (bottom panel).
    turn = 2 * gemm
    for slot in range(int(end / turn) + 1):
        consumer = slot % 2
        start = slot * turn
        if start + turn > end:
            break
        j = slot // 2
        for axis in axes[1:]:
            box(axis, start, 0, gemm, f"S{j + 1} c{consumer}", QUERY_COLOUR)
            box(axis, start + gemm, 0, gemm, f"PV{j} c{consumer}", VALUE_COLOUR)
        box(axes[1], start, 2 - consumer, turn, f"wait for S{j + 1} and PV{j}", wait)
        if start + turn + softmax <= end:
            box(axes[1], start + turn, 2 - consumer, softmax, f"softmax S{j + 1}", STATE_COLOUR)
        box(axes[2], start, 2 - consumer, gemm, f"wait for S{j + 1}", wait)
        if start + gemm + softmax <= end:
            box(axes[2], start + gemm, 2 - consumer, softmax, f"softmax S{j + 1}", STATE_COLOUR)
    finish_timeline(plt, figure, axes, end, "10_pingpong.png",
                    ("09: the consumers run in step; the tensor cores idle while both "
                     "compute the softmax",
                     "10, D = 64's order (drawn with two consumers; D = 64 has three): on its turn "
                     "(bar.sync / bar.arrive) a consumer issues\nS_{j+1} with P_j V_j, waits for "
                     "both, then computes the softmax of S_{j+1} under the other consumers' GEMMs",
                     "10 at D = 128: wait_group 1 waits for S_{j+1} only, so the softmax also runs "
                     "under the consumer's own P_j V_j\n(the softmax called in both arms of the "
                     "mask branch keeps ptxas from moving wait_group 0 before it)"))


def backward_flow_11(plt, found):
    """11: the warpgroups of a backward block and where dK, dV and dQ accumulate."""
    c = found["11_hopper_backward"]
    figure, axis = blank(plt, 13.5, 6.6, 13.5, 7.6)
    grey = "#8c8c8c"
    flow_box(axis, 0.2, 5.9, 2.6, 1.2, "preprocess kernel\nδ = rowsum(dO ∘ O)\nLSE·log2 e (padded)", grey,
             size=8)
    flow_box(axis, 0.2, 3.7, 2.6, 1.4, "producer warpgroup\nK, V once;\nQ, dO, LSE, δ per\n"
             f"query tile ({c['BLOCK_Q_D64']} rows at D = 64,\n{c['BLOCK_Q_D128']} at D = 128)", "#6a51a3", size=8)
    flow_arrow(axis, (1.5, 5.9), (1.5, 5.1))
    flow_box(axis, 3.8, 3.5, 3.0, 1.8, f"shared memory\nK, V ({c['BLOCK_KV']} keys)\n"
             f"ring of {c['STAGES']}: Q, dO, LSE, δ\nfull / empty barriers", KEY_COLOUR, size=8)
    flow_arrow(axis, (2.8, 4.4), (3.8, 4.4), "TMA", offset=(0, 0.08))
    for consumer in range(c["CONSUMERS"]):
        y = 5.3 - consumer * 2.6
        # Consumer 0 multiplies its piece of dQ a tile late: consumer 1's half of dS^T of tile j
        # is not written yet when consumer 0 takes its second turn of tile j.
        piece = "tile j - 1" if consumer == 0 else "tile j"
        flow_box(axis, 7.9, y, 3.0, 1.8, f"consumer {consumer}: keys {64 * consumer}-{64 * consumer + 63}\n"
                 "turn 1: Sᵀ = K Qᵀ, dPᵀ = V dOᵀ (ss)\nthen Pᵀ, dSᵀ in registers\n"
                 f"turn 2: dV += Pᵀ dO, dK += dSᵀ Q (rs)\n+ its dQ piece of {piece}", QUERY_COLOUR, size=7.5)
        flow_arrow(axis, (6.8, 4.4), (7.9, y + 0.9))
        flow_box(axis, 11.6, y + 0.4, 1.7, 1.0, "dK, dV\nin registers\n-> TMA store", VALUE_COLOUR, size=7.5)
        flow_arrow(axis, (10.9, y + 0.9), (11.6, y + 0.9))
    # The consumers take turns at issuing their wgmma (named barriers, as in stage 10).
    flow_arrow(axis, (8.15, 5.3), (8.15, 4.5))
    flow_arrow(axis, (10.65, 4.5), (10.65, 5.3))
    axis.text(9.4, 4.9, "turns at the tensor cores:\nbar.sync / bar.arrive", ha="center", va="center",
              fontsize=7, family="monospace")
    flow_box(axis, 7.9, 0.2, 3.0, 1.6, "dSᵀ (both halves) in shared memory,\n2 buffers: tiles j and j - 1\n"
             "each a 64 × 64 piece of dQ = dS K (ss)\nwith rowsum(dS) = dS·1 (N = 64 + 8; at\n"
             "D = 128 c0's only): tile j's by c1, in\nits dK, dV turn, tile j - 1's by c0 (a\ntile later) -> FP32 staging tiles",
             STATE_COLOUR, size=7.5)
    flow_arrow(axis, (9.4, 2.7), (9.4, 1.8))
    # Consumer 0's half of dS^T goes to the same shared tile: a path around consumer 1.
    axis.plot([10.9, 11.3, 11.3], [5.6, 5.6, 1.2], color="#333333", linewidth=1.0)
    flow_arrow(axis, (11.3, 1.2), (10.9, 1.2))
    axis.text(11.4, 2.2, "each consumer writes\nits half of dSᵀ", fontsize=7.5, va="center")
    flow_box(axis, 3.8, 0.2, 3.0, 1.6, "FP32 dQ accumulator\nand rowsum(dS) in device\nmemory (every block adds)",
             grey, size=7.5)
    flow_arrow(axis, (7.9, 1.0), (6.8, 1.0), "cp.reduce\n.async.bulk\n.add.f32", offset=(0, 0.08), size=6.5)
    flow_box(axis, 0.2, 0.2, 2.6, 1.6, "convert kernel\n(dQ - rowsum(dS)·mean K)\n· scale -> bf16",
             grey, size=7.5)
    flow_arrow(axis, (3.8, 1.0), (2.8, 1.0))
    axis.set_title(f"Stage 11, one block per {c['BLOCK_KV']} keys: what flows where", fontsize=10,
                   loc="left")
    save(plt, figure, "11_backward_flow.png")


def backward_turns_11(plt, found):
    """11, lockstep against turns: when each consumer's GEMMs, Pᵀ, dSᵀ and dQ hand-over run
    (schematic)."""
    from matplotlib.patches import Rectangle
    if found["11_hopper_backward"]["CONSUMERS"] != 2:
        raise SystemExit("draw.py: 11_backward_turns.png draws the turns of two consumers: update it")
    # One consumer's GEMMs: Sᵀ and dPᵀ (g1); dK and dV; its dQ piece with rowsum(dS). Its Pᵀ, dSᵀ
    # (exp, dS, packing, its half of dSᵀ to shared memory); its dQ hand-over (staging, reduce-add).
    g1, gkv, gq, ds, out = 2.0, 2.0, 1.2, 1.6, 1.4
    g2 = gkv + gq
    figure, axes = plt.subplots(2, 1, figsize=(13, 5.0), sharex=True)

    def box(axis, x, y, width, label, colour, alpha=0.85):
        axis.add_patch(Rectangle((x, y - 0.32), width, 0.64, facecolor=colour, alpha=alpha,
                                 edgecolor="white"))
        axis.text(x + width / 2, y, label, ha="center", va="center", fontsize=7, color="white",
                  linespacing=1.1)

    def tile(k):
        return "j" if k == 0 else f"j{k:+d}"

    wait, out_colour, dq_colour = "#b0b0b0", "#6a51a3", KEY_COLOUR
    # Lockstep: both consumers issue Sᵀ, dPᵀ together and wait; compute Pᵀ, dSᵀ together while
    # the tensor cores idle; issue dK, dV, meet, issue dQ, wait; hand dQ over together while the
    # tensor cores idle again.
    tiles = 2
    x = 0.0
    for k in range(tiles):
        t = tile(k)
        for consumer in range(2):
            row = 2 - consumer
            box(axes[0], x, row, 2 * g1, f"wait for Sᵀ, dPᵀ {t}", wait)
            box(axes[0], x + 2 * g1, row, ds, f"Pᵀ, dSᵀ {t}", STATE_COLOUR)
            box(axes[0], x + 2 * g1 + ds, row, 2 * g2, "meet (bar.sync); wait for dK, dV, dQ", wait)
            box(axes[0], x + 2 * g1 + ds + 2 * g2, row, out, f"dQ {t}\nout", out_colour)
        box(axes[0], x, 0, g1, f"Sᵀ, dPᵀ {t}\nc0", QUERY_COLOUR)
        box(axes[0], x + g1, 0, g1, f"Sᵀ, dPᵀ {t}\nc1", QUERY_COLOUR)
        start = x + 2 * g1 + ds
        box(axes[0], start, 0, gkv, f"dK, dV {t}\nc0", VALUE_COLOUR)
        box(axes[0], start + gkv, 0, gkv, f"dK, dV {t}\nc1", VALUE_COLOUR)
        box(axes[0], start + 2 * gkv, 0, gq, f"dQ {t}\nc0", dq_colour)
        box(axes[0], start + 2 * gkv + gq, 0, gq, f"dQ {t}\nc1", dq_colour)
        x += 2 * g1 + ds + 2 * g2 + out
    end = x
    # Turns: G1 of consumer 0, G1 of consumer 1, G2 of consumer 0 (with its dQ piece of the
    # previous tile), G2 of consumer 1 (with its piece of this tile). A consumer computes Pᵀ, dSᵀ
    # or hands dQ over while the other one's GEMMs run; the tensor cores never wait. Steady
    # state from tile j on: the row starts with consumer 1 handing over its piece of tile j - 1.
    period = 2 * g1 + 2 * g2
    turns = [0.0]
    for k in range(-1, int(end / period) + 1):
        t, x = tile(k), k * period
        phases = [  # (row, start, width, label, colour)
            (0, x, g1, f"Sᵀ, dPᵀ {t}\nc0", QUERY_COLOUR),
            (0, x + g1, g1, f"Sᵀ, dPᵀ {t}\nc1", QUERY_COLOUR),
            (0, x + 2 * g1, gkv, f"dK, dV {t}\nc0", VALUE_COLOUR),
            (0, x + 2 * g1 + gkv, gq, f"dQ {tile(k - 1)}\nc0", dq_colour),
            (0, x + 2 * g1 + g2, gkv, f"dK, dV {t}\nc1", VALUE_COLOUR),
            (0, x + 2 * g1 + g2 + gkv, gq, f"dQ {t}\nc1", dq_colour),
            (2, x, g1, "Sᵀ, dPᵀ run", wait),
            (2, x + g1, ds, f"Pᵀ, dSᵀ {t}", STATE_COLOUR),
            (2, x + 2 * g1, g2, "dK, dV, dQ run", wait),
            (2, x + 2 * g1 + g2, out, f"dQ {tile(k - 1)}\nout", out_colour),
            (1, x + g1, g1, "Sᵀ, dPᵀ run", wait),
            (1, x + 2 * g1, ds, f"Pᵀ, dSᵀ {t}", STATE_COLOUR),
            (1, x + 2 * g1 + g2, g2, "dK, dV, dQ run", wait),
            (1, x + period, out, f"dQ {t}\nout", out_colour),
        ]
        for row, start, width, label, colour in phases:  # cut at the end of the top panel
            if 0 <= start < end - 0.5:
                if start + width > end:  # a shorter box: its label on two lines
                    width, label = end - start, "\n".join(label.rsplit(" ", 1))
                box(axes[1], start, row, width, label, colour)
        turns += [x + g1, x + 2 * g1, x + 2 * g1 + g2, x + period]
    for boundary in turns:
        if 0 < boundary < end:
            axes[1].axvline(boundary, color="#555555", linestyle=":", linewidth=0.8, zorder=0)
    finish_timeline(plt, figure, axes, end, "11_backward_turns.png",
                    ("lockstep (before): the consumers issue together, compute Pᵀ, dSᵀ together "
                     "and hand dQ over together; the tensor cores idle meanwhile",
                     "turns (now; dotted lines: bar.arrive passes the turn, bar.sync takes it): "
                     "one consumer computes Pᵀ, dSᵀ or hands dQ over under the other's GEMMs"))


def rowsum_fold_11(plt, found):
    """11: dQ's GEMM with the row sums of dS riding on it: B is the piece's slab of K, then
    columns of a tile of ones that the descriptor's leading byte offset reaches."""
    from matplotlib.patches import Rectangle
    stage = found["11_hopper_backward"]
    keys, ones = stage["BLOCK_KV"], stage["DQ_N_ONES"]
    figure, axis = blank(plt, 11.5, 5.6, 23, 11.2)
    axis.set_title(f"Stage 11: dQ's piece and rowsum(dS) in one wgmma, m64n{64 + ones}k16 "
                   f"over the block's {keys} keys", loc="left", fontsize=11)
    blue, green, red, grey = "#4c72b0", "#55a868", "#c44e52", "#8c8c8c"

    def block(x, y, w, h, colour, text, size=8.5, text_colour="white"):
        axis.add_patch(Rectangle((x, y), w, h, facecolor=colour, edgecolor="#333333", linewidth=0.7))
        axis.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, color=text_colour)

    # The GEMM: A (dS, the piece's 64 queries x all keys) times B (K's slab, then the ones).
    unit = 0.045  # drawing units per row or column
    top = 10.2
    a_w, a_h = keys * unit, 64 * unit
    block(0.4, top - a_h, a_w, a_h, red, f"A = dS\n64 queries × {keys} keys\n(dSᵀ in shared memory)")
    axis.text(0.4 + a_w + 0.35, top - a_h / 2, "×", fontsize=18, ha="center", va="center")
    bx = 0.4 + a_w + 0.8
    k_w, o_w, b_h = 64 * unit, ones * unit * 2.2, keys * unit
    block(bx, top - b_h, k_w, b_h, blue, f"B: the piece's\nslab of K,\n{keys} keys\n× 64 columns", size=8)
    block(bx + k_w, top - b_h, o_w, b_h, green, f"{ones}\ncols\nof\nones", size=7.5)
    axis.text(bx + k_w + o_w + 0.35, top - a_h / 2, "=", fontsize=18, ha="center", va="center")
    cx = bx + k_w + o_w + 0.8
    block(cx, top - a_h, k_w, a_h, blue, "dQ's piece,\n64 × 64\n(FP32)", size=8)
    block(cx + k_w, top - a_h, o_w, a_h, green, "Σ", size=10)
    axis.text(cx + k_w + o_w + 0.25, top - a_h / 2,
              f"columns 64..{63 + ones}: each holds\nrowsum(dS) of the piece's\nqueries over all {keys} keys\n"
              "(at D = 128 the two pieces\nshare their queries: only\nconsumer 0's GEMM has the\nones, consumer 1's is\nm64n64k16)",
              fontsize=8, va="center", ha="left")

    # Shared memory: where the descriptor finds the two parts of B.
    y, h = 2.2, 1.1
    regions = [("K (slab 0 | slab 1)", 3.4, blue), ("V", 2.6, grey), ("Q, dO ring", 3.2, grey),
               ("dSᵀ ×2", 2.4, red), ("dQ staging", 2.0, grey), ("ones", 2.2, green), ("…", 1.4, grey)]
    x = 0.4
    starts = {}
    for name, width, colour in regions:
        block(x, y, width, h, colour, name, size=8)
        starts[name] = x
        x += width
    axis.text(0.4, y + h + 0.15, "the backward block's shared memory (BackwardSharedLayout), in order",
              fontsize=8.5, ha="left", va="bottom")
    k_start, ones_start = starts["K (slab 0 | slab 1)"], starts["ones"]
    axis.annotate("", xy=(ones_start + 0.05, y - 0.25), xytext=(k_start + 0.05, y - 0.25),
                  arrowprops=dict(arrowstyle="-|>", color="#222222", linewidth=1.0))
    axis.text((k_start + ones_start) / 2, y - 0.4,
              "B's descriptor: its start is the piece's slab of K, its leading byte offset (from one\n"
              "64-column slab of B to the next) the distance from there to the tile of ones",
              fontsize=8, ha="center", va="top")
    axis.text(0.4, 0.2, f"{ones} more columns of B per k-step replace a separate m64n8k16 per 16 keys, "
              "whose A (2 KB of dSᵀ) was read again for 8 columns of output.",
              fontsize=8.5, ha="left")
    save(plt, figure, "11_rowsum_fold.png")


def deterministic_sums_11(plt, found):
    """11: the deterministic mode's dQ as integers: the kernels of a call, and one row's int32."""
    c = found["11_hopper_backward"]
    bits = c["FIXED_POINT_BITS"]
    figure, axis = blank(plt, 13.5, 6.4, 13.5, 7.4)
    grey = "#8c8c8c"
    # The call, left to right.
    flow_box(axis, 0.2, 4.9, 2.3, 1.7, f"K/V bounds kernel\nper head, {c['KV_BOUND_CHUNKS']} chunks of keys:\n"
             "Kmax = max |K|\nVmax = max |Vⱼ|", KEY_COLOUR, size=7.5)
    flow_box(axis, 3.0, 4.9, 2.5, 1.7, "preprocess kernel\nδᵢ, LSEᵢ, and per row\n"
             "boundᵢ = |dOᵢ| (Vmax + |Oᵢ|) Kmax\n"
             f"sᵢ = 2^({bits - 1} - ⌊log2 boundᵢ⌋)", grey, size=7.5)
    flow_arrow(axis, (2.5, 5.75), (3.0, 5.75))
    flow_box(axis, 6.0, 4.9, 3.0, 1.7, "backward kernel, each block:\nconsumer: its 64 × 64 piece of dQ\n"
             "× sᵢ, rounded to int32 (F2I)\n-> staging; writer:\ncp.reduce.async.bulk .add.s32",
             QUERY_COLOUR, size=7.5)
    flow_arrow(axis, (5.5, 5.75), (6.0, 5.75), "sᵢ", offset=(0, 0.05))
    flow_box(axis, 9.5, 4.9, 1.9, 1.7, "int32 dQ and\nrowsum(dS) in\ndevice memory:\nblocks add in\nany order",
             STATE_COLOUR, size=7.5)
    flow_arrow(axis, (9.0, 5.75), (9.5, 5.75))
    flow_box(axis, 11.8, 4.9, 1.6, 1.7, "convert kernel\n÷ sᵢ (exact),\n- rowsum·mean K,\n· scale -> bf16",
             grey, size=7.5)
    flow_arrow(axis, (11.4, 5.75), (11.8, 5.75))
    axis.text(0.2, 4.35, "Integer addition is associative: the same terms in any order give the same bits, "
              "so no block waits for another.\nThe K column sums still go per block and are folded in block "
              "order (a small kernel before the conversion).", fontsize=8, va="top")
    # One row's int32: where the bound sits.
    left, width, y, height = 0.9, 11.6, 1.6, 0.7
    cell = width / 32
    for bit in range(32):
        x = left + (31 - bit) * cell
        colour = "#dddddd" if bit == 31 else ("#f3d9c7" if bit >= bits else "#c9d6ea")
        axis.add_patch(__import__("matplotlib.patches", fromlist=["Rectangle"]).Rectangle(
            (x, y), cell, height, facecolor=colour, edgecolor="#666666", linewidth=0.5))
        if bit in (0, bits - 1, bits, 30, 31):
            axis.text(x + cell / 2, y - 0.15, str(bit), ha="center", va="top", fontsize=7)
    axis.text(left + cell / 2, y + height / 2, "±", ha="center", va="center", fontsize=8)
    axis.text(left + 2 * cell, y + height + 0.12, "headroom ×4", ha="center", va="bottom", fontsize=7.5)
    axis.text(left + (32 - bits / 2) * cell, y + height + 0.12,
              f"boundᵢ × sᵢ < 2^{bits}: every partial sum of the row fits here", ha="center", va="bottom",
              fontsize=7.5)
    axis.text(left + 31.5 * cell, y - 0.45, "step 1 / sᵢ ≤ boundᵢ / 2^" + str(bits - 1), ha="right", va="top",
              fontsize=7.5)
    axis.text(0.2, 3.0, "One query row's dQ in the accumulator (int32):", fontsize=8.5, va="top")
    axis.set_title("Stage 11's deterministic dQ: a scale per row, then integers", fontsize=10, loc="left")
    save(plt, figure, "11_deterministic_sums.png")


H100_SMS = 132  # an H100 SXM's SMs, the GPU of the chapters' measurements


def progressive_convert_11(plt, found):
    """11: where the conversion of dQ runs against the main kernel's rounds: after the whole grid
    (before, and still for short grids), or beside its last round, each head as soon as head_done
    says its sums are whole (schematic: a few SMs and heads; the counts are the kernel's)."""
    from matplotlib.patches import Rectangle
    c = found["11_hopper_backward"]
    arrivals, min_rounds = c["HEAD_ARRIVALS"], c["PROGRESSIVE_MIN_ROUNDS"]
    batch, heads_h, _, len_kv, _, _ = found["bf16-headline"]
    headline_blocks = batch * heads_h * -(-len_kv // c["BLOCK_KV"])
    headline_idle = -(-headline_blocks // H100_SMS) * H100_SMS - headline_blocks
    if headline_blocks <= (min_rounds - 1) * H100_SMS:
        raise SystemExit("draw.py: bf16-headline no longer converts beside the last round: update "
                         "11_progressive_convert.png's caption")
    # The schematic: a few SMs, heads of a few key blocks each, more than min_rounds - 1 rounds
    # and a last round that leaves SMs idle.
    sms, heads, key_blocks, per_head = 8, 6, 5, 4  # per_head: conversion blocks drawn per head
    blocks = heads * key_blocks
    if blocks <= (min_rounds - 1) * sms or blocks % sms == 0:
        raise SystemExit("draw.py: 11_progressive_convert.png's grid no longer converts beside a "
                         "last round with idle SMs: update it")
    pre, block, convert = 0.7, 3.0, 0.3
    # The main grid: blocks in index order, each to the SM that frees first (equal blocks: rounds).
    free, main = [pre] * sms, []
    for b in range(blocks):
        sm = min(range(sms), key=lambda s: (free[s], s))
        main.append((sm, free[sm], free[sm] + block, b // key_blocks, b % key_blocks))
        free[sm] += block
    launch = max(start for _, start, *_ in main)  # every main block has started
    grid_end = max(end for _, _, end, *_ in main)
    head_end = [max(end for _, _, end, h, _ in main if h == head) for head in range(heads)]
    rounds = -(-blocks // sms)

    def conversion(beside):
        """(sm, start, converts_from, end, head) of each conversion block, in index order."""
        available, boxes = list(free), []
        count = heads * per_head
        for i in range(count):
            head = i // per_head
            sm = min(range(sms), key=lambda s: (max(available[s], launch), s))
            start = max(available[sm], launch)
            ready = head_end[head] if beside else grid_end
            if beside and i == count - 1:
                ready = max(ready, grid_end)  # the grid's last block waits for the main grid too
            begin = max(start, ready)
            boxes.append((sm, start, begin, begin + convert, head))
            available[sm] = begin + convert
        return boxes

    palette = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]
    figure, axes = plt.subplots(2, 1, figsize=(12.5, 9.6), sharex=True)
    figure.subplots_adjust(hspace=0.34, top=0.875)
    schedules = (conversion(False), conversion(True))
    finish = max(end for schedule in schedules for *_, end, _ in schedule)
    for axis, schedule, beside in zip(axes, schedules, (False, True)):
        axis.add_patch(Rectangle((0, -0.36), pre, sms - 0.28, facecolor="#8c8c8c", edgecolor="white"))
        axis.text(pre / 2, (sms - 1) / 2, "preprocessing", rotation=90, ha="center", va="center",
                  fontsize=8, color="white")
        for sm, start, end, head, key_block in main:
            axis.add_patch(Rectangle((start, sm - 0.36), end - start, 0.72, facecolor=palette[head],
                                     alpha=0.85, edgecolor="white"))
            axis.text((start + end) / 2, sm, f"head {head}, key block {key_block}", ha="center",
                      va="center", fontsize=8, color="white")
        for sm, start, begin, end, head in schedule:
            if begin > start:  # waiting: for the grid (top) or on head_done[head] (bottom)
                axis.add_patch(Rectangle((start, sm - 0.26), begin - start, 0.52, facecolor="white",
                                         edgecolor=palette[head], hatch="////", linewidth=0.8))
                if begin - start > 1.5:
                    axis.text((start + begin) / 2, sm, f"h{head}: spins on head_done[{head}]" if beside
                              else f"h{head}: griddepcontrol.wait", ha="center",
                              va="center", fontsize=7, family="monospace",
                              bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
            axis.add_patch(Rectangle((begin, sm - 0.26), end - begin, 0.52, facecolor=palette[head],
                                     edgecolor="#333333", linewidth=0.6))
            axis.text((begin + end) / 2, sm, f"h{head}", ha="center", va="center", fontsize=7.5,
                      color="white")
        for x in (launch, grid_end):
            axis.axvline(x, color="#555555", linestyle=":", linewidth=0.8, zorder=0)
        end = max(e for *_, e, _ in schedule)
        axis.annotate("", (end, -0.62), (grid_end, -0.62),
                      arrowprops={"arrowstyle": "<|-|>", "color": "#222222", "linewidth": 0.8,
                                  "shrinkA": 0, "shrinkB": 0, "mutation_scale": 7})
        tail = sorted({h for *_, begin, _, h in schedule if begin >= grid_end})
        heads_in_tail = f"heads {tail[0]}-{tail[-1]}" if len(tail) > 1 else f"head {tail[0]}"
        axis.text(end + 0.12, -0.62, f"tail after the main kernel: {heads_in_tail}",
                  ha="left", va="center", fontsize=8)
        axis.set_yticks(list(range(sms)))
        axis.set_yticklabels([f"SM {sm}" for sm in range(sms)], fontsize=8)
        axis.set_ylim(-0.85, sms + 0.75)
        axis.set_ylabel(f"SMs ({sms} drawn for {H100_SMS})", fontsize=8.5)
        for spine in ("top", "right"):
            axis.spines[spine].set_visible(False)
    top, bottom = axes
    top.text(launch - 0.05, sms - 0.35, "conversion launched: every main block has started", fontsize=8,
             ha="right", va="bottom")
    top.text(grid_end + 0.05, sms - 0.35, "main grid ends", fontsize=8, ha="left", va="bottom")
    for r in range(rounds):
        idle = rounds * sms - blocks if r == rounds - 1 else 0
        top.text(pre + (r + 0.5) * block, -0.62, f"round {r}" + (f" (last): {idle} SMs idle" if idle else ""),
                 ha="center", va="center", fontsize=8, color="#444444")
    # The counter of one head converted beside the last round, and of one that waits for it.
    early = max(h for h in range(heads) if head_end[h] <= launch)
    late = min(h for h in range(heads) if head_end[h] > launch)
    boxes = schedules[1]
    first_early = min((b for b in boxes if b[4] == early), key=lambda b: (-b[0], b[2]))
    first_late = min((b for b in boxes if b[4] == late and b[2] > b[1]), key=lambda b: (-b[0], b[1]))
    bottom.annotate(f"head_done[{early}] reached {arrivals} × {key_blocks} = {arrivals * key_blocks} "
                    f"when head {early}'s\nlast block ended: its blocks convert at once",
                    (first_early[2] + convert / 2, first_early[0] + 0.26),
                    (launch - 0.4, sms - 0.05), ha="right", va="bottom", fontsize=8,
                    arrowprops={"arrowstyle": "-|>", "color": "#222222", "linewidth": 0.7,
                                "shrinkA": 1, "shrinkB": 1, "mutation_scale": 7})
    bottom.annotate(f"head {late}'s blocks spin (ld.acquire,\nnanosleep) while head_done[{late}] "
                    f"< {arrivals} × {key_blocks}:\nhead {late}'s last block still runs",
                    ((first_late[1] + first_late[2]) / 2, first_late[0] + 0.26),
                    (grid_end + 0.5, sms - 0.05), ha="left", va="bottom", fontsize=8,
                    arrowprops={"arrowstyle": "-|>", "color": "#222222", "linewidth": 0.7,
                                "shrinkA": 1, "shrinkB": 1, "mutation_scale": 7})
    top.set_title(f"after the grid (before; still the path for grids of fewer than {min_rounds} rounds): "
                  "the conversion's first blocks wait on the idle SMs\n(griddepcontrol.wait) until the "
                  "whole main grid has ended; then every head is converted", fontsize=9.5, loc="left")
    bottom.set_title(f"beside the last round (now, from {min_rounds} rounds on): a main block's {arrivals} "
                     f"dQ writers each add 1 to head_done[head] once their last reduce-add is complete\n"
                     f"and their K column sums are in; a conversion block ({c['CONVERT_THREADS']} float4s "
                     f"of one head) converts once the count reaches {arrivals} × the head's key blocks.\n"
                     "Only the last round's heads are left for the tail; the conversion's last block "
                     "also waits for the main grid (dK, dV)", fontsize=9.5, loc="left")
    bottom.set_xlim(0, finish + 3.2)
    bottom.set_xticks([])
    bottom.set_xlabel("time (schematic: durations are illustrative, not measured; the chapter's "
                      "profile has the real numbers)")
    figure.suptitle(f"Stage 11's backward: preprocessing, the main kernel (a block per {c['BLOCK_KV']} "
                    f"keys of a head, one per SM, handed out in order) and the conversion of dQ\n(FP32 -> "
                    f"bf16). bf16-headline's {headline_blocks} blocks take {headline_blocks / H100_SMS:.2f} "
                    f"rounds of {H100_SMS} SMs: the last round leaves {headline_idle} idle, where the "
                    f"conversion's first blocks start.\nSmall boxes: the conversion's blocks (hN: of "
                    f"head N), hatched while they wait", fontsize=10, x=0.02, ha="left")
    save(plt, figure, "11_progressive_convert.png")


def persistent_block_12(plt, found):
    """12: one block of the persistent grid: who announces the work tiles, who reads them, and
    where Q, K, V come in and O goes out."""
    from matplotlib.patches import Rectangle
    c = found["12_persistent"]
    d128, d64, causal = c["Tiling128"], c["Tiling64"], c["Tiling128Causal"]
    buffers = c["O_BUFFERS"]
    figure, axis = blank(plt, 13.5, 7.4, 13.5, 8.4)
    grey, producer, ring = "#8c8c8c", "#6a51a3", "#3b3b3b"
    flow_box(axis, 0.2, 6.3, 3.0, 1.5, "device memory\nQ, K, V, O: [B·H][len][D] bf16\nthe tile counter: one int "
             f"(from {c['COUNTED_FROM']} causal or\n{c['COUNTED_FROM_NONCAUSAL']} non-causal work tiles per SM on)", grey, size=7.5)
    # The producer warpgroup: the loader and the storer, one thread each.
    axis.add_patch(Rectangle((0.45, 0.3), 2.85, 5.5, facecolor="none", edgecolor=producer,
                             linestyle="--", linewidth=0.8))
    axis.text(1.9, 5.5, "producer warpgroup", ha="center", fontsize=8.5, color=producer)
    axis.text(1.9, 5.2, f"setmaxnreg.dec -> {c['PRODUCER_REGISTERS'][0]} ({c['PRODUCER_REGISTERS'][1]} "
              "at D = 64)", ha="center", fontsize=7, color=producer)
    flow_box(axis, 0.6, 2.9, 2.55, 1.9, "warp 0: the loader\npicks the next work tile\nand announces it; "
             "loads\nits K/V tiles and each\nconsumer's Q rows", producer, size=7.5)
    flow_box(axis, 0.6, 0.5, 2.55, 1.7, "warp 1: the storer\nstores each staged O\nby TMA, then frees\n"
             "its buffer", producer, size=7.5)
    flow_arrow(axis, (1.4, 4.8), (1.4, 6.3), style="<|-|>")
    axis.text(1.5, 5.9, "atomicAdd", ha="left", fontsize=7, family="monospace")
    axis.plot([0.6, 0.25, 0.25], [1.35, 1.35, 6.1], color=VALUE_COLOUR, linewidth=1.0)
    flow_arrow(axis, (0.25, 6.0), (0.25, 6.3), colour=VALUE_COLOUR)
    axis.text(0.3, 3.2, "TMA store of O", rotation=90, ha="left", va="center", fontsize=7,
              family="monospace", color=VALUE_COLOUR)
    # Shared memory: the K/V ring, each consumer's Q rows, the announcements, the O buffers.
    axis.add_patch(Rectangle((4.1, 0.3), 4.1, 7.6, facecolor="none", edgecolor="#333333",
                             linestyle="--", linewidth=0.8))
    axis.text(6.15, 8.0, "shared memory (one block per SM)", ha="center", fontsize=8.5)
    flow_box(axis, 4.25, 6.1, 3.8, 1.6, f"K/V ring: {d128[3]} stages of K and V\n({d128[2]} keys, "
             f"{causal[2]} causal, {d64[2]} at D = 64);\nits position counts every K/V tile\n"
             "of the block: it runs on", KEY_COLOUR, size=7.5)
    flow_box(axis, 4.25, 4.4, 3.8, 1.4, "Q: 64 rows per consumer, reloaded\nfor the next work tile once "
             "its last\nS = Q Kᵀ of this one is done (q_empty)", QUERY_COLOUR, size=7.5)
    flow_box(axis, 4.25, 2.5, 3.8, 1.6, f"schedule: a ring of {c['SCHEDULE_SLOTS']} work tiles\n(head, first "
             "query row, K/V tiles),\nfull / empty per slot; read by lane 0\nof every consumer warp and "
             "the storer", ring, size=7.5)
    flow_box(axis, 4.25, 0.5, 3.8, 1.7, f"O buffers of 64 rows: {buffers['Tiling128']} at {d128[2]} keys\n"
             f"(taken in turn), {buffers['Tiling128Causal']} causal, {buffers['Tiling64']} at D = 64;\n"
             f"o_full counts {c['O_FULL_ARRIVALS']} arrivals: every thread\nafter its own stores and fence",
             VALUE_COLOUR, size=7.5)
    flow_arrow(axis, (3.2, 7.3), (4.25, 6.9), "TMA", offset=(0, 0.05))
    flow_arrow(axis, (3.2, 6.6), (4.25, 5.1), "", colour=QUERY_COLOUR)
    flow_arrow(axis, (3.15, 3.6), (4.25, 3.3), "announce", offset=(0, 0.05))
    flow_arrow(axis, (4.25, 2.7), (3.15, 1.9))
    flow_arrow(axis, (4.25, 1.0), (3.15, 1.0), "o_full", offset=(0, 0.05), colour=VALUE_COLOUR)
    # The consumers: stage 10's loop per work tile, the passage between work tiles.
    count = d128[1]
    height = 7.2 / count
    for consumer in range(count):
        y = 7.7 - (consumer + 1) * height + 0.25
        flow_box(axis, 9.4, y, 3.9, height - 0.5,
                 f"consumer {consumer}: rows {64 * consumer}-{64 * consumer + 63}\n"
                 "per work tile, stage 10's ping-pong loop\nover its K/V tiles; between two work\n"
                 "tiles: the next S₀ issued with the last\nP V, then O / l staged, LSE written",
                 STATE_COLOUR, size=7.5)
        centre = y + (height - 0.5) / 2
        flow_arrow(axis, (8.05, 6.9), (9.4, centre + 0.6), colour=KEY_COLOUR)
        flow_arrow(axis, (8.05, 5.1), (9.4, centre + 0.2), colour=QUERY_COLOUR)
        flow_arrow(axis, (8.05, 3.3), (9.4, centre - 0.2), colour=ring)
        flow_arrow(axis, (9.4, centre - 0.6), (8.05, 1.4), colour=VALUE_COLOUR)
    axis.text(11.35, 0.1, f"(D = 64: {d64[1]} consumers of 64 rows)", ha="center", fontsize=7.5)
    axis.set_title(f"Stage 12, one block of the persistent grid ({d128[1]} consumers at D = 128): the "
                   "loader announces each work tile to the consumer warps and the storer",
                   fontsize=10, loc="left")
    save(plt, figure, "12_persistent_block.png")

def main():
    found = constants()
    if "--check" in sys.argv[1:]:
        with open(MANIFEST) as handle:
            committed = json.load(handle)
        if committed != found:
            print("stale: docs/diagrams/*.png were drawn from other kernel constants; "
                  "run `python3 docs/diagrams/draw.py` and look at the images")
            for key in sorted(set(found) | set(committed)):
                if found.get(key) != committed.get(key):
                    print(f"  {key}: images {committed.get(key)}, sources {found.get(key)}")
            return 1
        return 0
    plt = setup()
    tiling(plt, found, "02_tiled", "02_tiling.png")
    tiling(plt, found, "03_online_softmax", "03_online_loop.png")
    register_tiling(plt, found)
    mma_fragments(plt)
    ldmatrix_lanes(plt, found)
    swizzle_banks(plt, found)
    pipeline(plt, found)
    backward_loop(plt, found)
    data_path_08(plt, found)
    swizzle_descriptor_08(plt, found)
    warp_roles_09(plt, found)
    barrier_phases_09(plt, found)
    pingpong_10(plt, found)
    backward_flow_11(plt, found)
    backward_turns_11(plt, found)
    rowsum_fold_11(plt, found)
    deterministic_sums_11(plt, found)
    progressive_convert_11(plt, found)
    persistent_block_12(plt, found)
    with open(MANIFEST, "w") as handle:
        json.dump(found, handle, indent=2, sort_keys=True)
        handle.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
