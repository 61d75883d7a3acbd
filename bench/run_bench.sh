#!/usr/bin/env bash
# The whole benchmark, as `make bench` runs it:
#   1. builds the C ABI library of every stage (arguments, or STAGES of the top-level Makefile)
#      and of the two cuBLAS eager baselines, and the cuBLAS BF16 benchmark binary (ceilings);
#   2. measures the ceilings once (cuBLAS BF16 and FP32 GEMM, device-to-device copy), and
#      PyTorch's matmul beside them as a check;
#   3. times every stage and baseline over the sweeps in one process, bench/driver.py: per shape
#      and pass, every implementation in interleaved slices, by one rule, with the A/A check of
#      the stages that carry a copy of another's forward (docs/benchmarking.md), and the
#      deterministic backward's time over the default's where a stage has one; needs PyTorch;
#   4. writes bench/results/<gpu>/{results.csv,ceilings.csv,system.txt,bench.log,aa-check.txt,
#      deterministic-check.txt}, replacing the previous run's files only once everything
#      succeeded;
#   5. draws this run's figures into bench/results/<gpu>/img/ (the committed figures in
#      docs/img/ change only with `make plots`).
# Before anything is built it checks for a GPU and sets up the Python environment of the plots
# (common/python_env.sh: .deps/venv on first use), stopping with one line when either fails.
#
# usage: bench/run_bench.sh [STAGE_DIR ...]
# Environment (defaults in brackets): BENCH_SWEEPS [fp32-headline,bf16-headline,seqlen,extra],
#   BENCH_DTYPES [fp32,bf16] the element types timed, BENCH_COMMIT [git HEAD] the commit to
#   record (pass it where the tree's .git is not the commit's: the lent GPU machine's copy),
#   JOBS [nproc] build parallelism, PYTHON [common/python_env.sh's: python3 or .deps/venv].
# A run says when it passes 10 minutes, building included; its system.txt records how long it took.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
source bench/system_lines.sh
SWEEPS=${BENCH_SWEEPS:-fp32-headline,bf16-headline,seqlen,extra}
DTYPES=${BENCH_DTYPES:-fp32,bf16}
JOBS=${JOBS:-$(nproc)}
START=$SECONDS

# ---- what the run needs, before anything is built -----------------------------------------
problem=$(bash common/require.sh gpu "make bench")
[ -z "$problem" ] || { echo "error: $problem" >&2; exit 2; }
if [ -z "${PYTHON:-}" ]; then
    PYTHON=$(bash common/python_env.sh plots) || { echo "error: $PYTHON" >&2; exit 2; }
fi
if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "error: make bench needs PyTorch with CUDA in $PYTHON (pip install torch): the baselines" \
         "and the schedule that times every stage run on it" >&2
    exit 2
fi

elapsed() { printf '%dm%02ds' $(((SECONDS - START) / 60)) $(((SECONDS - START) % 60)); }

mkdir -p bench/results
WORK=$(mktemp -d "$ROOT/bench/results/.run-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
LOG=$WORK/bench.log
say() { echo "$*" | tee -a "$LOG"; }

# A makefile fragment that prints a variable of the makefile it is read after.
PRINTER=$WORK/print.mk
# shellcheck disable=SC2016  # $($*) is for make, not the shell
printf 'print-%%:\n\t@echo $($*)\n' >"$PRINTER"
make_variable() {  # make_variable DIR NAME
    make -s --no-print-directory -C "$1" -f Makefile -f "$PRINTER" "print-$2"
}

# ---- what to run --------------------------------------------------------------------------
stages=("$@")
if [ ${#stages[@]} -eq 0 ]; then
    read -r -a stages <<<"$(make_variable "$ROOT" STAGES 2>/dev/null || true)"
fi
if [ ${#stages[@]} -eq 0 ]; then
    for dir in [0-9][0-9]_*/; do [ -f "$dir/Makefile" ] && stages+=("${dir%/}"); done
fi
suites=()
for suite in "${stages[@]}" bench/cublas_fp32 bench/cublas_bf16; do
    suite=${suite%/}
    [[ " ${suites[*]-} " == *" $suite "* ]] || suites+=("$suite")
done

# ---- build --------------------------------------------------------------------------------
# Every suite's C ABI library (what bench/driver.py times), and the benchmark binary of the last
# suite, cuBLAS BF16, for the ceilings.
say "== building ${#suites[@]} libraries: ${suites[*]}"
pids=()
# The objects the suites share first, suite by suite (common/stage.mk), so that no two makes
# write the same file; then all suites at once, together about JOBS compiler processes.
for suite in "${suites[@]}"; do
    if ! make --no-print-directory -C "$suite" -j"$JOBS" common-bench-objects >>"$WORK/build-common.log" 2>&1; then
        say "error: building the shared objects for $suite failed:"
        tail -n 40 "$WORK/build-common.log" | tee -a "$LOG" >&2
        say "no results written"
        exit 1
    fi
done
jobs_each=$(((JOBS + ${#suites[@]} - 1) / ${#suites[@]}))
ceilings_suite=${suites[-1]}
ceilings_binary=$(make_variable "$ceilings_suite" BENCH_BIN)
for suite in "${suites[@]}"; do
    targets=("$(make_variable "$suite" LIB)")
    [ "$suite" != "$ceilings_suite" ] || targets+=("$ceilings_binary")
    log="$WORK/build-$(basename "$suite").log"
    make --no-print-directory -C "$suite" -j"$jobs_each" "${targets[@]}" >"$log" 2>&1 &
    pids+=($!)
done
failed=0
for index in "${!suites[@]}"; do
    if ! wait "${pids[$index]}"; then
        say "error: building ${suites[$index]} failed:"
        tail -n 40 "$WORK/build-$(basename "${suites[$index]}").log" | tee -a "$LOG" >&2
        failed=1
    fi
done
[ $failed -eq 0 ] || { say "no results written"; exit 1; }
say "== built in $(elapsed)"

# ---- ceilings -----------------------------------------------------------------------------
COMMIT=${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
[ -n "${BENCH_COMMIT:-}" ] || git diff-index --quiet HEAD -- 2>/dev/null || COMMIT="$COMMIT+uncommitted"
say "== measuring the ceilings"
"$ceilings_binary" --ceilings --ceilings-file "$WORK/ceilings.csv" | tee -a "$LOG"
# PyTorch's matmul right after cuBLAS's GEMM, so that the check on the ceiling sees the GPU in the
# same state (bench/baselines.py's docstring says why).
"$PYTHON" bench/baselines.py --ceilings-file "$WORK/ceilings.csv" 2>&1 | tee -a "$LOG"
GPU=$(awk -F, 'NR == 2 { print $1 }' "$WORK/ceilings.csv" | tr -d '"')
SLUG=$(echo "$GPU" | tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+|-+$//g')
[ -n "$SLUG" ] || { say "error: no GPU name in the ceilings"; exit 1; }

# ---- every stage and baseline -------------------------------------------------------------
# One process times every implementation by one rule, shape by shape in rotating rounds
# (bench/driver.py, docs/benchmarking.md).
METHOD=$("$PYTHON" bench/driver.py --describe)
say "== every stage and baseline in one schedule ($(elapsed) so far)"
stage_list=$(IFS=,; echo "${suites[*]}")
"$PYTHON" -u bench/driver.py --stages "$stage_list" --sweep "$SWEEPS" --csv "$WORK/results.csv" \
    --ceilings-file "$WORK/ceilings.csv" --aa-file "$WORK/aa-check.txt" \
    --deterministic-file "$WORK/deterministic-check.txt" --commit "$COMMIT" \
    --dtypes "$DTYPES" 2>&1 | tee -a "$LOG"

# ---- the system the numbers belong to -----------------------------------------------------
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $COMMIT"
    echo "gpu (the CUDA device benchmarked): $GPU"
    system_lines "$PYTHON"
    echo "method: $METHOD"
    echo "implementations: ${suites[*]} + PyTorch baselines"
    echo "sweeps: $SWEEPS"
    echo "element types: $DTYPES"
    echo "duration: $(elapsed)"
} >"$WORK/system.txt"

# ---- into place ---------------------------------------------------------------------------
DEST=bench/results/$SLUG
mkdir -p "$DEST"
say "== done in $(elapsed): $(($(wc -l <"$WORK/results.csv") - 1)) rows, results in $DEST/"
[ $((SECONDS - START)) -le 600 ] || say "note: over the 10-minute budget"
rm -f "$DEST/aa-check.txt" "$DEST/deterministic-check.txt"
for file in results.csv ceilings.csv system.txt bench.log aa-check.txt deterministic-check.txt; do
    if [ -f "$WORK/$file" ]; then mv -f "$WORK/$file" "$DEST/$file"; fi
done

if [ -f bench/plots.py ]; then
    echo "== plots of this run: $DEST/img/ (make plots RESULTS=$DEST redraws docs/img/ from it)"
    "$PYTHON" bench/plots.py "$DEST" --out "$DEST/img" ||
        echo "warning: bench/plots.py failed; the results are in place" >&2
fi
