#!/usr/bin/env python3
"""Summaries of Nsight Compute reports for the evidence in docs/profiles/.

The metrics the FP32 chapters quote, from the raw page of a report:

    ncu -i build/fp32_evidence/02_tiled.ncu-rep --page raw --csv > 02_tiled-ncu-raw.csv
    python3 bench/experiments/summarize_ncu.py 02_tiled-ncu-raw.csv > docs/profiles/02_tiled/ncu-headline-summary.txt

prints one block per profiled kernel: time, occupancy, instruction mix, shared and global
memory traffic, and the warp stall reasons sorted by weight.

Where the warps of a Hopper kernel stall, line by line (stages 08-10's ncu-stall-lines.txt):

    make -C 09_warp_specialized profile NCU_COUNT=1 KERNEL=flash
    ncu -i build/09_warp_specialized/profile.ncu-rep --page source --csv --print-source sass > P-source-sass.csv
    ncu -i build/09_warp_specialized/profile.ncu-rep --page details --csv > P-details.csv
    cp build/09_warp_specialized/profile.ncu-rep P.ncu-rep   # or --page raw --csv --print-units base > P-raw.csv
    python3 bench/experiments/summarize_ncu.py --stall-lines P --commit COMMIT \
        > docs/profiles/09_warp_specialized/ncu-stall-lines.txt

with P a path prefix such as exports/09_warp_specialized, and P-profile.log (optional) the
output of the make line, from which the shape and the ncu command are taken. It prints the
headline metrics, the stall reasons as a share of the warp-state samples (all warps, then
the producer warp's code and the rest apart where the kernel has a producer), the samples
grouped by what the warps wait on, and the SASS lines with the most samples, labelled.
"""
import csv
import datetime
import os
import re
import struct
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


ROWS = [
    ("duration (ms, profiled, caches flushed)", "gpu__time_duration.sum", "time"),
    ("registers per thread", "launch__registers_per_thread", 1),
    ("dynamic shared memory per block (bytes)", "launch__shared_mem_per_block_dynamic", None),
    ("block limit: registers", "launch__occupancy_limit_registers", 1),
    ("block limit: shared memory", "launch__occupancy_limit_shared_mem", 1),
    ("theoretical occupancy (%)", "sm__maximum_warps_per_active_cycle_pct", 1),
    ("achieved occupancy (%)", "sm__warps_active.avg.pct_of_peak_sustained_active", 1),
    ("issue slots busy (%)", "sm__inst_issued.avg.pct_of_peak_sustained_active", 1),
    ("FMA pipe active (%)", "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", 1),
    ("L1/shared throughput (%)", "l1tex__throughput.avg.pct_of_peak_sustained_active", 1),
    ("warp instructions executed", "smsp__inst_executed.sum", 1),
    ("FFMA thread instructions", "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum", 1),
    ("shared load instructions (warp)", "smsp__sass_inst_executed_op_shared_ld.sum", 1),
    ("shared load wavefronts", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", 1),
    ("shared load bank conflicts", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", 1),
    ("shared store bank conflicts", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum", 1),
    ("global load requests", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", 1),
    ("global load sectors", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", 1),
    ("L2 traffic (bytes)", "lts__t_bytes.sum", None),
    ("DRAM read (bytes)", "dram__bytes_read.sum", None),
    ("DRAM write (bytes)", "dram__bytes_write.sum", None),
]

STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"


def to_ms(value, unit):
    scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1, "second": 1e3}
    return value * scale.get(unit.split("/")[0], 1)


def to_bytes(value, unit):
    scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}
    return value * scale.get(unit.split("/")[0], 1)


def main(path):
    with open(path, newline="") as handle:
        rows = [row for row in csv.reader(handle) if row]
    header = rows[0]
    units = dict(zip(header, rows[1]))
    for values in rows[2:]:
        metric = dict(zip(header, values))
        print(f"kernel: {metric.get('Kernel Name', '?')}")
        print(f"grid {metric.get('Grid Size', '?')} x block {metric.get('Block Size', '?')}")
        for label, name, scale in ROWS:
            value = number(metric.get(name))
            if value is None:
                continue
            if scale == "time":
                print(f"  {label:44s} {to_ms(value, units.get(name, '')):.3f}")
            elif scale is None:
                value = to_bytes(value, units.get(name, ""))
                print(f"  {label:44s} {value:,.0f}")
            else:
                value *= scale
                print(f"  {label:44s} {value:,.2f}" if value < 1000 else f"  {label:44s} {value:,.0f}")
        sectors = number(metric.get("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"))
        requests = number(metric.get("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"))
        if sectors and requests:
            print(f"  {'global load sectors per request':44s} {sectors / requests:.2f}")
        shared = number(metric.get("smsp__sass_inst_executed_op_shared_ld.sum"))
        ffma = number(metric.get("smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"))
        if shared and ffma:
            print(f"  {'FFMA (thread) per shared load (thread)':44s} {ffma / (32 * shared):.2f}")
        stalls = []
        for name, text in metric.items():
            if name.startswith(STALL_PREFIX) and name.endswith(STALL_SUFFIX):
                value = number(text)
                if value:
                    stalls.append((value, name[len(STALL_PREFIX):-len(STALL_SUFFIX)]))
        total = sum(value for value, _ in stalls)
        print("  warp stalls (cycles per issued instruction, share of all):")
        for value, reason in sorted(stalls, reverse=True)[:8]:
            print(f"    {reason:24s} {value:6.2f}  {100 * value / total:5.1f}%")
        print()


# --- Where the warps of a Hopper kernel stall: --stall-lines -------------------------------

def _varint(data, at):
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def _fields(data):
    """The fields of one protocol-buffer message: (number, wire type, value) in order."""
    at, fields = 0, []
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 1:
            value, at = data[at:at + 8], at + 8
        elif wire == 5:
            value, at = data[at:at + 4], at + 4
        elif wire == 2:
            length, at = _varint(data, at)
            value, at = data[at:at + length], at + length
        else:
            raise ValueError(f"wire type {wire}")
        fields.append((number, wire, value))
    return fields


def _metric_value(message):
    value = None
    for number, wire, field in _fields(message):
        if wire == 1:
            value = struct.unpack("<d", field)[0]
        elif wire == 5:
            value = struct.unpack("<f", field)[0]
        elif wire == 0:
            value = field
        elif number == 1:
            value = field.decode(errors="replace")
    return value


def read_report(path):
    """Every metric of an .ncu-rep file, without ncu: {name: value}, and the time the report
    was made (seconds since 1970: field 2 of the first header's field 3).

    The layout, as read from Nsight Compute 2025.3's files (it is not documented): "NVR" and a
    zero byte, then blocks, each a 4-byte length and a header message (protocol buffers),
    followed, when the header's field 5 gives a size, by a payload of that size (a 4-byte
    length and a message). A profiled kernel's
    header carries the metric names (field 4, a list of strings); its payload's fields 13 are
    the metrics, each an index into that list (field 1) and a value (field 2: a string, a
    double or an integer). stall_lines() checks what this reads against the details page, so
    a format this does not understand stops the script instead of giving wrong numbers.
    `ncu --import FILE --page raw --csv --print-units base` gives the same metrics where ncu is
    installed (read_raw_csv)."""
    with open(path, "rb") as handle:
        data = handle.read()
    if data[:4] != b"NVR\0":
        raise SystemExit(f"{path}: not an Nsight Compute report")
    metrics, created, at = {}, None, 4
    while at + 4 <= len(data):
        length = struct.unpack("<I", data[at:at + 4])[0]
        header = _fields(data[at + 4:at + 4 + length])
        at += 4 + length
        size = next((value for number, wire, value in header if number == 5 and wire == 0), 0)
        payload = data[at:at + size]
        at += size
        for number, wire, value in header:
            if number == 3 and wire == 2 and created is None:
                created = next((v for n, w, v in _fields(value) if n == 2 and w == 0), None)
        names = next(([name.decode() for n, w, name in _fields(value) if n == 1]
                      for number, wire, value in header if number == 4 and wire == 2 and value), None)
        if not names or len(payload) < 4:
            continue
        message = payload[4:4 + struct.unpack("<I", payload[:4])[0]]
        for number, wire, value in _fields(message):
            if number != 13 or wire != 2:
                continue
            index, result = None, None
            for n, w, v in _fields(value):
                if n == 1 and w == 0:
                    index = v
                elif n == 2 and w == 2:
                    result = _metric_value(v)
            if index is not None and index < len(names):
                metrics[names[index]] = result
    return metrics, created


def read_raw_csv(path):
    """The metrics of `ncu --import FILE --page raw --csv --print-units base` (the first kernel;
    base units, so that a duration is in nanoseconds): {name: value}."""
    with open(path, newline="") as handle:
        rows = [row for row in csv.reader(handle) if row]
    return {name: (number(text) if number(text) is not None else text)
            for name, text in zip(rows[0], rows[2])}, None


def read_details(path):
    """The details page (`--page details --csv`): {(section, metric): value}."""
    details = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if row["Metric Name"]:
                details[(row["Section Name"], row["Metric Name"])] = number(row["Metric Value"])
    return details


def read_source(path):
    """The source page with SASS (`--page source --csv --print-source sass`): the kernel's
    name and one dict per instruction: offset from the first, text, samples by reason."""
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    kernel = rows[0][1] if len(rows[0]) > 1 else "?"
    header = rows[1]
    column = {name: index for index, name in enumerate(header)}
    reasons = [name for name in header if name.startswith("stall_") and "(" not in name]
    lines, base = [], None
    for row in rows[2:]:
        address = int(row[column["Address"]], 16)
        base = address if base is None else base
        samples = int(row[column["Warp Stall Sampling (All Samples)"]] or 0)
        by_reason = {name[len("stall_"):]: int(row[column[name]] or 0) for name in reasons}
        by_reason = {name: count for name, count in by_reason.items() if count}
        # The page has no column for the gmma reason (warps waiting on WARPGROUP.ARRIVES):
        # a line's samples that no column holds are those.
        gmma = samples - sum(by_reason.values())
        if gmma:
            by_reason["gmma"] = gmma
        lines.append({"offset": address - base, "address": address,
                      "sass": row[column["Source"]].strip(), "samples": samples,
                      "reasons": by_reason,
                      "executed": int(row[column["Instructions Executed"]] or 0)})
    return kernel, lines


def opcode(sass):
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def producer_code(lines):
    """Indices of the producer warp's code: from setmaxnreg.dec (USETMAXREG.DEALLOC, with the
    WARPSYNC just before it) to the first unpredicated EXIT after it, and the retry loops of its
    mbarrier waits that ptxas placed after the kernel's end. Empty for a kernel without one."""
    start = next((i for i, line in enumerate(lines)
                  if opcode(line["sass"]).startswith("USETMAXREG.DEALLOC")), None)
    if start is None:
        return set()
    if start > 0 and lines[start - 1]["sass"].startswith("WARPSYNC"):
        start -= 1
    end = next(i for i in range(start, len(lines)) if lines[i]["sass"] == "EXIT")
    region = set(range(start, end + 1))
    by_address = {line["address"]: i for i, line in enumerate(lines)}
    for i in range(start, end + 1):
        match = re.match(r"@!?U?P\d\s+BRA\s+(0x[0-9a-f]+)", lines[i]["sass"])
        target = by_address.get(int(match.group(1), 16)) if match else None
        if target is None or start <= target <= end:
            continue
        while target < len(lines):
            region.add(target)
            if lines[target]["sass"].startswith("BRA "):
                break
            target += 1
    return region


def mbarrier_waits(lines):
    """{index of each try-wait instruction outside the retry loops: (the indices of its wait,
    the index of the branch on its result)}: the SYNCS...TRYWAIT, the branch that the samples
    land on (the warp waits there for the try-wait's answer), and the retry loop it branches
    to, wherever ptxas put it."""
    by_address = {line["address"]: i for i, line in enumerate(lines)}
    waits, retry = {}, set()
    for i, line in enumerate(lines):
        if "TRYWAIT" not in line["sass"] or i in retry:
            continue
        members, branch = {i}, None
        predicate = re.search(r"TRYWAIT\s+(P\d)", line["sass"])
        # ptxas may move the try-wait ahead of the branch that tests it (09 tests V's in the
        # softmax): the branch is the next instruction that names the predicate.
        for j in range(i + 1, len(lines)):
            if predicate and re.search(rf"\b{predicate.group(1)}\b", lines[j]["sass"]):
                if re.match(rf"@!{predicate.group(1)}\s+BRA\s", lines[j]["sass"]):
                    branch = j
                break
        if branch is not None:
            members.add(branch)
            match = re.search(r"BRA\s+(0x[0-9a-f]+)", lines[branch]["sass"])
            target = by_address.get(int(match.group(1), 16)) if match else None
            if target is not None and target > branch and any(
                    "TRYWAIT" in lines[k]["sass"] for k in range(target, min(target + 2, len(lines)))):
                j = target
                while j < len(lines):
                    members.add(j)
                    retry.add(j)
                    if lines[j]["sass"].startswith("BRA "):
                        break
                    j += 1
        waits[i] = (members, branch)
    return waits


def wgmma_kind(sass, backward=False):
    """Which GEMM an HGMMA belongs to. Forward: P V reads V transposed. Backward (stage 11):
    dQ = dS K reads dS^T transposed, dK and dV take dS^T and P^T from registers, and S^T, dP^T
    (which the SASS does not tell apart) read both operands from shared memory as they lie."""
    if backward:
        if "tnspA" in sass:
            return "dQ = dS K"
        if re.match(r"HGMMA\.\S+\s+R\d+,\s*R\d+,", sass):
            return "dK += dS^T Q, dV += P^T dO"
        return "S^T = K Q^T or dP^T = V dO^T"
    if "tnspB" in sass:
        return "O += P V"
    return "S = Q K^T"


def waited_groups(lines, backward=False):
    """{index of each WARPGROUP.DEPBAR.LE gsb0, N: (the commit groups it waits for, those still
    in flight before it)}, walking the code in order: a group ends with the HGMMA that carries
    gsb0, and the wait leaves the last N groups running (they are waited for further on)."""
    in_flight, current, waits = [], [], {}
    for i, line in enumerate(lines):
        sass = line["sass"]
        if opcode(sass).startswith("HGMMA"):
            current.append(sass)
            if "gsb0" in sass:
                in_flight.append(" with ".join(dict.fromkeys(wgmma_kind(h, backward) for h in current))
                                 if backward else wgmma_kind(current[0]))
                current = []
        elif "WARPGROUP.DEPBAR" in sass:
            allowed = int(sass.rsplit(",", 1)[1], 16)
            keep = len(in_flight) - allowed if allowed else len(in_flight)
            waits[i] = (in_flight[:keep], in_flight[:])
            in_flight = in_flight[keep:]
    return waits


def barrier_before(lines, i):
    """The BAR.SYNC whose wait a line's barrier samples belong to: with BAR.SYNC.DEFER_BLOCKING
    the warp goes on issuing and the samples land on the first instruction that has to wait."""
    for j in range(i - 1, max(i - 17, -1), -1):
        sass = lines[j]["sass"]
        if opcode(sass).startswith("BAR.SYNC"):
            return j
        if "DEPBAR" in sass or sass == "EXIT" or sass.startswith("BRA "):
            return None
    return None


def named_barrier(sass):
    operands = sass.split(None, 1)[1] if " " in sass else ""
    if operands.strip() == "0x0":
        return "__syncthreads (bar.sync 0, the whole block)"
    count = operands.split(",")[-1].strip()
    return f"a named barrier (bar.sync with {int(count, 16)} threads)"


def label_lines(lines, producer, wait_names, backward=False):
    """One label and one group per instruction: what the warps that were sampled there wait on."""
    waits = mbarrier_waits(lines)
    ordered = sorted(waits)
    roles = {"producer": [i for i in ordered if i in producer],
             "consumer": [i for i in ordered if i not in producer]}
    name_of = {}
    for role, indices in roles.items():
        names = wait_names.get(role, [])
        if names and len(names) != len(indices):
            raise SystemExit(f"{len(indices)} mbarrier waits in the {role}'s code, "
                             f"{len(names)} names given: the SASS changed, update WAIT_NAMES")
        for index, name in zip(indices, names):
            name_of[index] = name
    member_of = {member: head for head, (members, branch) in waits.items() for member in members}
    groups = waited_groups(lines, backward)
    for i, line in enumerate(lines):
        sass, reasons = line["sass"], line["reasons"]
        role = "producer" if i in producer else "consumers"
        drain = reasons.get("drain", 0) * 2 > line["samples"] > 0
        if "WARPGROUP.DEPBAR" in sass:
            waited, issued = groups[i]
            what = " and ".join(waited) or "nothing"
            note = f" ({' and '.join(issued)} in flight)" if len(issued) > len(waited) else ""
            line["label"] = f"wgmma.wait_group {int(sass.rsplit(',', 1)[1], 16)}: waits for {what}{note}"
            line["group"] = "wgmma.wait_group (WARPGROUP.DEPBAR)"
        elif i in member_of and not drain:
            head = member_of[i]
            name = name_of.get(head, "an mbarrier")
            kind = "try-wait on" if i in (head, waits[head][1]) else "the retry loop of"
            line["label"] = f"mbarrier wait, {role}: {kind} {name}"
            line["group"] = f"mbarrier waits, {role}"
        elif drain:
            line["label"] = "after EXIT: the warp's stores draining before it retires"
            line["group"] = "everything else (addresses, loop control, shuffles, epilogue, ...)"
        elif reasons.get("barrier", 0) * 2 > line["samples"] > 0 and barrier_before(lines, i) is not None:
            j = barrier_before(lines, i)
            line["label"] = (f"waits at the BAR.SYNC {line['offset'] - lines[j]['offset']:#x} bytes "
                             f"before: {named_barrier(lines[j]['sass'])}")
            line["group"] = "__syncthreads and named barriers (BAR.SYNC)"
        elif opcode(sass).startswith("BAR."):
            line["label"] = named_barrier(sass) if opcode(sass).startswith("BAR.SYNC") else "barrier arrive"
            line["group"] = "__syncthreads and named barriers (BAR.SYNC)"
        elif opcode(sass).startswith("HGMMA"):
            line["label"] = f"wgmma issue: {wgmma_kind(sass, backward)}"
            line["group"] = "wgmma issue (HGMMA)"
        elif opcode(sass) == "MUFU.EX2":
            line["label"] = "exponential (exp2)"
            line["group"] = "exponentials (MUFU.EX2)"
        else:
            known = {"FMNMX": "row maximum", "SHFL.BFLY": "quad reduction (shuffle)",
                     "F2FP.BF16.F32.PACK_AB": "rounded to bf16 (P, or O in the epilogue)"}
            line["label"] = known.get(opcode(sass), "")
            line["group"] = ("other FP32 arithmetic and packing (FMNMX, FADD, FFMA, FMUL, F2FP, ...)"
                             if re.match(r"F(MNMX|ADD|FMA|MUL|2FP|SETP|SEL)", opcode(sass))
                             else "everything else (addresses, loop control, shuffles, epilogue, ...)")


def share(part, whole):
    return 100.0 * part / whole if whole else 0.0


def reason_line(counts, total):
    ranked = sorted(counts.items(), key=lambda item: -item[1])
    return ", ".join(f"{name} {share(count, total):.1f}" for name, count in ranked
                     if share(count, total) >= 0.05)


def sum_reasons(lines):
    counts = {}
    for line in lines:
        for name, count in line["reasons"].items():
            counts[name] = counts.get(name, 0) + count
    return counts


# Which barrier each mbarrier try-wait waits on, in the order of the code (source order, as
# ptxas keeps it); checked against the number of try-waits each role's SASS has.
WAIT_NAMES = {
    "08_wgmma_tma": {"consumer": ["Q (once per warp)", "the tile's K and V (full)"]},
    "09_warp_specialized": {
        "consumer": ["Q (once per warp)", "K_j (full)", "V_j (full)"],
        "producer": ["K's stage free (empty)", "V's stage free (empty)"]},
    "10_pingpong": {
        "consumer": ["Q (once per warp)", "K_0 (full, tile 0)", "K_j (full)", "V_j-1 (full)",
                     "the last V (full)"],
        "producer": ["K's stage free (empty)", "V's stage free (empty)"]},
}


def stall_lines(prefix, commit, top, stage=None):
    stage = stage or os.path.basename(prefix)
    kernel, lines = read_source(prefix + "-source-sass.csv")
    details = read_details(prefix + "-details.csv")
    if os.path.exists(prefix + "-raw.csv"):
        raw, created = read_raw_csv(prefix + "-raw.csv")
        raw_source = f"{os.path.basename(prefix)}-raw.csv"
    else:
        raw, created = read_report(prefix + ".ncu-rep")
        raw_source = f"{os.path.basename(prefix)}.ncu-rep, read by this script"
    log = open(prefix + "-profile.log").read() if os.path.exists(prefix + "-profile.log") else ""

    def detail(section, name):
        value = details.get((section, name))
        if value is None:
            raise SystemExit(f"{prefix}-details.csv: no {section} / {name}")
        return value

    # What the report reader gives must agree with the details page where both have a value.
    checks = [("GPU Speed Of Light Throughput", "Duration", "gpu__time_duration.sum", 1e-3, 0.01),
              ("GPU Speed Of Light Throughput", "L2 Cache Throughput",
               "lts__throughput.avg.pct_of_peak_sustained_elapsed", 1, 0.01),
              ("GPU Speed Of Light Throughput", "Compute (SM) Throughput",
               "sm__throughput.avg.pct_of_peak_sustained_elapsed", 1, 0.01),
              ("Instruction Statistics", "Executed Instructions", "smsp__inst_executed.sum", 1, 0.5)]
    for section, name, metric, scale, tolerance in checks:
        if abs(detail(section, name) - raw[metric] * scale) > tolerance:
            raise SystemExit(f"{raw_source}: {metric} = {raw[metric]} disagrees with the details "
                             f"page's {name} = {detail(section, name)}")
    pcsamp = "smsp__pcsamp_warps_issue_stalled_"
    total = sum(line["samples"] for line in lines)
    if raw.get("smsp__pcsamp_sample_count") not in (None, total):
        raise SystemExit(f"{raw_source}: {raw['smsp__pcsamp_sample_count']} samples, "
                         f"the source page {total}")
    gmma_total = sum(line["reasons"].get("gmma", 0) for line in lines)
    if raw.get(pcsamp + "warpgroup_arrive") not in (None, gmma_total):
        raise SystemExit(f"{raw_source}: {raw[pcsamp + 'warpgroup_arrive']} warpgroup_arrive "
                         f"samples, the source page leaves {gmma_total} to no column")

    shape = re.search(r"fwd (B=\S+ H=\S+ Lq=\S+ Lk=\S+ D=\d+)(?: causal=(\d))?", log)
    command = re.search(r"^(ncu .*?)\s-o\s", log, re.M)
    date = (datetime.datetime.fromtimestamp(created, datetime.timezone.utc).strftime("%Y-%m-%d")
            if created else "date not recorded")
    clocks = ("default clocks (--clock-control none)" if "--clock-control none" in log
              else "clocks as ncu's command line in the log says")
    name = kernel[:kernel.rfind(">(") + 1] if ">(" in kernel else kernel.split("(")[0]
    name = name.replace("void ", "").replace("<unnamed>::", "").replace("(int)", "")
    direction = "backward" if "backward" in name else "forward"
    print(f"# Warp-stall samples of stage {stage[:2]}'s {direction} kernel as committed ({commit}), "
          f"{name}, Nsight Compute source page, all samples: the stall reasons and the SASS lines "
          f"with the most samples; {raw.get('device__attribute_display_name', 'GPU not recorded')}, "
          f"{date}, {clocks}.")
    if shape:
        causal = "causal" if shape.group(2) == "1" else "non-causal"
        sweep = re.search(r"--sweep (\S+)", log)
        print(f"# Shape: {shape.group(1)}, {causal}"
              + (f" (the {sweep.group(1)} sweep)" if sweep else "") + ", one kernel profiled "
              f"(make -C {stage} profile NCU_COUNT=1 KERNEL=flash"
              + (f": {command.group(1)}" if command else "") + ").")
    print(f"# Made by bench/experiments/summarize_ncu.py --stall-lines from the report's source page "
          f"(--page source --csv --print-source sass), details page (--page details --csv) and raw "
          f"metrics ({raw_source}; the details page lists no tensor-pipe metric). Offsets are bytes "
          f"from the kernel's first instruction.")

    size = dict(re.findall(r"(B|H|Lq|Lk|D)=(\d+)", shape.group(1))) if shape else {}
    flops = (4 * int(size["B"]) * int(size["H"]) * int(size["Lq"]) * int(size["Lk"]) * int(size["D"])
             // (2 if shape and shape.group(2) == "1" else 1)) if size else float("nan")
    print("## headline metrics")
    print(f"duration, us: {detail('GPU Speed Of Light Throughput', 'Duration'):.1f}")
    print(f"SM frequency, GHz: {detail('GPU Speed Of Light Throughput', 'SM Frequency'):.2f}")
    hmma = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
    print(f"tensor pipe active, % of active cycles: {raw[hmma]:.1f} ({hmma.split('.')[0]}, which "
          f"counts HGMMA too; sm__pipe_tensor_cycles_active: "
          f"{raw['sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active']:.1f})")
    ops = "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32_sparsity_off.sum"
    print(f"tensor pipe active, % of elapsed cycles: "
          f"{raw['sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed']:.1f} "
          f"(the details page's Compute (SM) Throughput: "
          f"{detail('GPU Speed Of Light Throughput', 'Compute (SM) Throughput'):.1f})")
    print(f"HGMMA bf16 math, % of peak over the elapsed cycles: {raw[ops + '.pct_of_peak_sustained_elapsed']:.1f} "
          f"({raw[ops]:,.0f} operations, {raw[ops] / raw['gpu__time_duration.sum'] / 1e3:.1f} "
          f"TFLOP/s over the profiled duration; the FlashAttention count for the shape: "
          f"{flops:,.0f})")
    gmma_inst = "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active"
    print(f"wgmma instructions executed (counted per warp): "
          f"{raw['smsp__sass_inst_executed_op_shared_gmma.sum']:,.0f}; "
          f"sm__inst_executed_pipe_tensor_op_gmma, % of peak: {raw[gmma_inst]:.1f} "
          f"(an instruction rate: one wgmma keeps the pipe busy for many cycles)")
    print("sm__pipe_tensor_op_gmma_cycles_active: "
          + ("not in the report (GH100 has no such metric)"
             if not any(key.startswith("sm__pipe_tensor_op_gmma_cycles_active") for key in raw)
             else f"{raw.get('sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active')}"))
    print(f"L2 throughput, % of peak: {detail('GPU Speed Of Light Throughput', 'L2 Cache Throughput'):.1f}")
    print(f"L1/shared throughput, % of peak: "
          f"{detail('GPU Speed Of Light Throughput', 'L1/TEX Cache Throughput'):.1f}")
    wavefronts = "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed"
    print(f"shared-memory wavefronts, % of peak: {raw[wavefronts]:.1f}")
    print(f"issue slots busy, %: {detail('Compute Workload Analysis', 'Issue Slots Busy'):.1f}")
    print(f"warps resident per SM: {detail('Occupancy', 'Achieved Active Warps Per SM'):.2f} "
          f"(theoretical {detail('Occupancy', 'Theoretical Active Warps per SM'):.0f}); blocks per SM "
          f"that the registers allow: {detail('Occupancy', 'Block Limit Registers'):.0f}, the shared "
          f"memory: {detail('Occupancy', 'Block Limit Shared Mem'):.0f} "
          f"({detail('Launch Statistics', 'Registers Per Thread'):.0f} registers per thread, "
          f"{detail('Launch Statistics', 'Block Size'):.0f} threads, "
          f"{detail('Launch Statistics', 'Dynamic Shared Memory Per Block'):.2f} KB of dynamic shared "
          f"memory per block)")
    print(f"samples: {total:,} (each SM records one resident warp's state every "
          f"{raw.get('smsp__pcsamp_interval_cycles', float('nan')):,.0f} cycles)")

    producer = producer_code(lines)
    waits = mbarrier_waits(lines)
    label_lines(lines, producer, WAIT_NAMES.get(stage, {}), "backward" in kernel)
    print("## stall reasons, % of samples (gmma: waiting on WARPGROUP.ARRIVES; the source page has "
          "no column for it, so it is each line's samples that no column holds, "
          f"{gmma_total:,} in all, as the report's {pcsamp}warpgroup_arrive)")
    print(f"all warps: {reason_line(sum_reasons(lines), total)}")
    ratios = {key[len(STALL_PREFIX):-len(STALL_SUFFIX)]: value for key, value in raw.items()
              if key.startswith(STALL_PREFIX) and key.endswith(STALL_SUFFIX) and value}
    print("the kernel's stall counters, not sampled (warps stalled per issued instruction, "
          f"{STALL_PREFIX}<reason>{STALL_SUFFIX}): " + ", ".join(
              f"{reason} {value:.2f}" for reason, value in sorted(ratios.items(), key=lambda item: -item[1])
              if value >= 0.05))
    if producer:
        mine = [line for i, line in enumerate(lines) if i in producer]
        rest = [line for i, line in enumerate(lines) if i not in producer]
        first = min(line["offset"] for line in mine)
        last = max(line["offset"] for i, line in enumerate(lines)
                   if i in producer and line["sass"] == "EXIT")
        inside = sum(line["samples"] for line in mine)
        print(f"producer warp's code (+{first:#x} to +{last:#x}, from setmaxnreg.dec to its EXIT, "
              f"and its retry loops): {share(inside, total):.1f}% of all samples; within them: "
              f"{reason_line(sum_reasons(mine), inside)}")
        everyone, theirs = sum_reasons(lines), sum_reasons(mine)
        print("the producer's part of each reason's samples: " + ", ".join(
            f"{reason} {share(theirs[reason], everyone[reason]):.0f}%"
            for reason in sorted(theirs, key=lambda reason: -share(theirs[reason], everyone[reason]))
            if share(theirs[reason], everyone[reason]) >= 5))
        print(f"the rest (the consumer warps, and the code before the roles split): "
              f"{reason_line(sum_reasons(rest), total - inside)} "
              f"(% of the rest's {total - inside:,} samples)")
    else:
        print("(no producer: every warp runs the same code)")

    print("## samples by what the warps wait on, % of all samples (and where the barrier samples sit)")
    groups, barrier = {}, {}
    for line in lines:
        groups[line["group"]] = groups.get(line["group"], 0) + line["samples"]
        barrier[line["group"]] = barrier.get(line["group"], 0) + line["reasons"].get("barrier", 0)
    barrier_total = sum(barrier.values())
    for group, count in sorted(groups.items(), key=lambda item: -item[1]):
        where = (f"  ({share(barrier[group], barrier_total):.1f}% of the barrier samples)"
                 if share(barrier[group], barrier_total) >= 0.5 else "")
        print(f"{share(count, total):5.1f}  {group}{where}")

    print("## mbarrier waits, in the order of the code: offset of the try-wait, whose, on what, "
          "times the warps tried (first try-waits, then retries in the loop), % of all samples")
    names = {}
    for role, indices in (("producer", [i for i in sorted(waits) if i in producer]),
                          ("consumer", [i for i in sorted(waits) if i not in producer])):
        for index, name in zip(indices, WAIT_NAMES.get(stage, {}).get(role, [])):
            names[index] = name
    for head, (members, branch) in sorted(waits.items()):
        retries = sum(lines[i]["executed"] for i in members
                      if i not in (head, branch) and "TRYWAIT" in lines[i]["sass"])
        samples = sum(lines[i]["samples"] for i in members if not lines[i]["label"].startswith("after EXIT"))
        print(f"+{lines[head]['offset']:05x}  {'producer' if head in producer else 'consumers'}: "
              f"{names.get(head, 'an mbarrier')}: {lines[head]['executed']:,} tries, {retries:,} retries, "
              f"{share(samples, total):.1f}%")

    print("## every wgmma.wait_group, in the order of the code: offset, times executed (per warp), "
          "% of all samples")
    for line in lines:
        if "WARPGROUP.DEPBAR" in line["sass"]:
            print(f"+{line['offset']:05x}  {line['label']}: {line['executed']:,}, "
                  f"{share(line['samples'], total):.1f}%")

    print(f"## the {top} SASS lines with the most samples: % of all samples, offset, instruction, "
          "what it is, its main reasons (% of the line)")
    for line in sorted(lines, key=lambda line: -line["samples"])[:top]:
        reasons = reason_line(dict(sorted(line["reasons"].items(), key=lambda item: -item[1])[:2]),
                              line["samples"])
        label = f"  [{line['label']}]" if line["label"] else ""
        print(f"{share(line['samples'], total):5.1f}%  +{line['offset']:05x}  {line['sass']}{label}  "
              f"({reasons})")


def stall_lines_main(arguments):
    import argparse
    parser = argparse.ArgumentParser(prog="summarize_ncu.py --stall-lines")
    parser.add_argument("prefix", help="PREFIX-source-sass.csv, PREFIX-details.csv, PREFIX.ncu-rep "
                        "or PREFIX-raw.csv, PREFIX-profile.log; the basename is the stage unless --stage says it")
    parser.add_argument("--commit", required=True, help="the commit the profiled kernel was built from")
    parser.add_argument("--top", type=int, default=20, help="how many SASS lines to list")
    parser.add_argument("--stage", help="the profiled stage's folder, where PREFIX's basename is not it "
                        "(it names the stage, and the mbarrier waits of the stages WAIT_NAMES lists)")
    options = parser.parse_args(arguments)
    stall_lines(options.prefix, options.commit, options.top, options.stage)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--stall-lines"]:
        stall_lines_main(sys.argv[2:])
    else:
        for argument in sys.argv[1:]:
            main(argument)
