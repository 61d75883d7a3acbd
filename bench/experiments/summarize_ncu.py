#!/usr/bin/env python3
"""The metrics the FP32 chapters quote, from the raw page of an Nsight Compute report.

    ncu -i build/fp32_evidence/02_tiled.ncu-rep --page raw --csv > 02_tiled-ncu-raw.csv
    python3 bench/experiments/summarize_ncu.py 02_tiled-ncu-raw.csv > docs/profiles/02_tiled/ncu-headline-summary.txt

Prints one block per profiled kernel: time, occupancy, instruction mix, shared and global
memory traffic, and the warp stall reasons sorted by weight.
"""
import csv
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


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        main(argument)
