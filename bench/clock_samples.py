#!/usr/bin/env python3
"""What the GPUs' clocks did while a benchmark ran, from nvidia-smi's samples, for a run's
system file (bench/run_ring_bench.sh samples every GPU of the ring once a second while its rows
run):

    nvidia-smi -i 0,1 --query-gpu=$(python3 bench/clock_samples.py --fields) \
        --format=csv,noheader,nounits -lms 1000 > SAMPLES
    python3 bench/clock_samples.py SAMPLES

One line per GPU over the samples in which it was busy (utilization 50% or more): the SM clock's
median and lowest, the board power's median and highest, the highest temperature, and each reason
the driver gave for holding the clock down (clocks_event_reasons.active, a bit mask) with the
share of busy samples it was given in. A run whose GPUs slowed shows it here, and which GPU and
why, where the system file's one nvidia-smi line (taken when the run ends, the GPUs idle) cannot.
"""

import argparse
import statistics
import sys

SAMPLE_FIELDS = "index,utilization.gpu,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"
BUSY = 50  # utilization (%) from which a sample counts as the GPU at work

# The bits of clocks_event_reasons.active that hold a busy GPU's clock down (NVML's
# nvmlClocksEventReasons; idle, the applications' setting and the display's are left out).
REASONS = {0x4: "power cap", 0x8: "hardware slowdown", 0x10: "sync boost",
           0x20: "software thermal", 0x40: "hardware thermal", 0x80: "power brake"}


def number(text):
    try:
        return float(text)
    except ValueError:  # [N/A], [Not Supported]
        return None


def read_samples(lines):
    """{gpu index: [(utilization, sm MHz, watts, degrees C, reason bits)]} from nvidia-smi's lines."""
    samples = {}
    for line in lines:
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 6 or not fields[0].isdigit():
            continue
        try:
            reasons = int(fields[5], 16)
        except ValueError:
            reasons = 0
        samples.setdefault(int(fields[0]), []).append(
            (number(fields[1]), number(fields[2]), number(fields[3]), number(fields[4]), reasons))
    return samples


def summary(samples):
    if not samples:
        return ["clocks while it ran: no samples (nvidia-smi did not answer)"]
    lines = [f"clocks while it ran (nvidia-smi once a second; samples with utilization {BUSY}% or more):"]
    for gpu in sorted(samples):
        busy = [s for s in samples[gpu] if s[0] is not None and s[0] >= BUSY]
        if not busy:
            lines.append(f"  GPU {gpu}: never busy in {len(samples[gpu])} samples")
            continue
        clocks = [s[1] for s in busy if s[1] is not None]
        watts = [s[2] for s in busy if s[2] is not None]
        degrees = [s[3] for s in busy if s[3] is not None]
        parts = [f"{len(busy)} of {len(samples[gpu])} samples busy"]
        if clocks:
            parts.append(f"SM clock median {statistics.median(clocks):.0f}, lowest {min(clocks):.0f} MHz")
        if watts:
            parts.append(f"power median {statistics.median(watts):.0f}, highest {max(watts):.0f} W")
        if degrees:
            parts.append(f"highest {max(degrees):.0f} C")
        held = [f"{name} {sum(1 for s in busy if s[4] & bit) / len(busy):.0%}"
                for bit, name in REASONS.items() if any(s[4] & bit for s in busy)]
        parts.append("clock held down by " + ", ".join(held) if held else "clock never held down")
        lines.append(f"  GPU {gpu}: " + "; ".join(parts))
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", nargs="?", help="nvidia-smi's lines, fields " + SAMPLE_FIELDS)
    parser.add_argument("--fields", action="store_true", help="print the fields nvidia-smi is to sample")
    arguments = parser.parse_args()
    if arguments.fields or arguments.samples is None:
        print(SAMPLE_FIELDS)
        return 0 if arguments.fields else 2
    with open(arguments.samples) as source:
        print("\n".join(summary(read_samples(source))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
