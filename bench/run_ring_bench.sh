#!/usr/bin/env bash
# The ring's benchmark, as `make bench-ring` runs it (13_ring_attention, lab notes 13):
#   1. builds stage 13 (NCCL from common/fetch_nccl.sh) and checks that the machine has 2 or more
#      GPUs;
#   2. for each GPU count P of RING_GPUS that the machine has, each per-GPU length L of
#      RING_TOKENS_PER_GPU and each sharding and mask (zigzag and striped causal, contiguous
#      non-causal): the ring over P GPUs at N = P * L tokens, forward and backward, in rounds with
#      the ring's kernels alone (stage 12's forward, stage 11's backward) at L tokens on each of the P GPUs at once (bench_13_ring_attention's
#      baseline) and with a second call of the ring, its A/A check; and, where PyTorch imports, PyTorch's context
#      parallelism at the same N and mask (bench/torch_context_parallel.py, one process per GPU),
#      so that each of its rows sits beside the ring's from the same run: after the ring's rows,
#      and at the first length before them too (two rounds; bench/ring_table.py takes the median
#      and prints their spread);
#   3. writes bench/results/<gpu>/ring/: per GPU count ring-xP.csv, its table table-xP.txt
#      (bench/ring_table.py) and system-xP.txt (the machine, and what its GPUs' clocks did while
#      the rows ran: bench/clock_samples.py), and scaling.png (bench/ring_plots.py, over every
#      ring-x*.csv of the folder; the figure names its files).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Each GPU count's files are replaced only when
# its rows are all written.
#
# usage: bench/run_ring_bench.sh
# Environment (defaults in brackets): RING_GPUS [2 4 8], RING_TOKENS_PER_GPU [32768 65536 131072],
#   RING_SHARDINGS [zigzag striped contiguous] (zigzag and striped causal, contiguous non-causal),
#   RING_PASS [both] (fwd, bwd or both), RING_HEADS [32], RING_HEAD_DIM [128], RING_REPEATS [3],
#   BENCH_COMMIT [git HEAD], PYTHON [common/python_env.sh's]. One count at a time fits the
#   device's 10-minute calls: RING_GPUS=4 make bench-ring; where one count does not (8 GPUs, the
#   longest lengths), a call per length, sharding or pass, each CSV joined afterwards (lab notes 13).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
source bench/system_lines.sh
export NCCL_NVLS_ENABLE=0
COUNTS=${RING_GPUS:-2 4 8}
TOKENS=${RING_TOKENS_PER_GPU:-32768 65536 131072}
HEADS=${RING_HEADS:-32}
HEAD_DIM=${RING_HEAD_DIM:-128}
REPEATS=${RING_REPEATS:-3}
SHARDINGS=${RING_SHARDINGS:-zigzag striped contiguous}
PASS=${RING_PASS:-both}
case "$PASS" in fwd | bwd | both) ;; *) echo "error: RING_PASS=$PASS (fwd, bwd or both)" >&2; exit 2 ;; esac
# The mask a sharding runs with: zigzag and striped balance the causal triangle, contiguous runs
# without the mask.
mask_of() {
    case "$1" in
        zigzag | striped) echo 1 ;;
        contiguous) echo 0 ;;
        *) return 1 ;;
    esac
}
MASKS=""  # the masks the shardings run, so that PyTorch runs only those
for sharding in $SHARDINGS; do
    mask=$(mask_of "$sharding") ||
        { echo "error: RING_SHARDINGS has '$sharding' (zigzag, striped, contiguous)" >&2; exit 2; }
    MASKS="$MASKS $mask"
done
MASKS=$(echo $MASKS | tr ' ' '\n' | sort -ru | tr '\n' ' ')
START=$SECONDS

problem=$(bash common/require.sh gpu "make bench-ring")
[ -z "$problem" ] || { echo "error: $problem" >&2; exit 2; }
VISIBLE=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
[ "$VISIBLE" -ge 2 ] || { echo "error: make bench-ring needs 2 or more GPUs ($VISIBLE visible)" >&2; exit 2; }
if [ -z "${PYTHON:-}" ]; then
    PYTHON=$(bash common/python_env.sh plots) || { echo "error: $PYTHON" >&2; exit 2; }
fi
TORCH=1
"$PYTHON" -c 'import torch.distributed' 2>/dev/null || TORCH=0

make --no-print-directory -C 13_ring_attention all || { echo "error: building 13_ring_attention failed" >&2; exit 1; }
BENCH=build/13_ring_attention/bench_13_ring_attention
COMMIT=${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0)
SLUG=$(echo "$GPU" | tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+|-+$//g')
DEST=bench/results/$SLUG/ring
mkdir -p "$DEST"
WORK=$(mktemp -d "$ROOT/bench/results/.ring-XXXXXX")
SAMPLER=""
trap '[ -z "$SAMPLER" ] || kill "$SAMPLER" 2>/dev/null; rm -rf "$WORK"' EXIT

# PyTorch's context parallelism at P GPUs and N tokens, with the masks of the shardings that run,
# rows appended to CSV.
torch_rows() {
    local P=$1 N=$2 CSV=$3 causal
    [ "$TORCH" = 1 ] || return 0
    for causal in $MASKS; do
        echo "== $P GPUs, $N tokens, PyTorch's context parallelism, causal $causal"
        if ! "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$P" \
                bench/torch_context_parallel.py --len "$N" --heads "$HEADS" --head-dim "$HEAD_DIM" \
                --causal "$causal" --pass "$PASS" --repeats "$REPEATS" --csv "$CSV" 2>"$WORK/torch-x$P.log"; then
            echo "   (failed; the last lines of its log:)"
            tail -n 3 "$WORK/torch-x$P.log"
        fi
    done
}

FIRST=${TOKENS%% *}
for P in $COUNTS; do
    if [ "$P" -gt "$VISIBLE" ]; then echo "== $P GPUs: skipped ($VISIBLE visible)"; continue; fi
    CSV=$WORK/ring-x$P.csv
    "$BENCH" --print-header >"$CSV"
    # The clocks of the ring's GPUs, once a second while its rows and PyTorch's run, summed up in
    # system-xP.txt (bench/clock_samples.py): a run whose GPUs slow down says so, and which.
    nvidia-smi -i "$(seq -s, 0 $((P - 1)))" --query-gpu="$("$PYTHON" bench/clock_samples.py --fields)" \
        --format=csv,noheader,nounits -lms 1000 >"$WORK/clocks-x$P.csv" 2>/dev/null &
    SAMPLER=$!
    for L in $TOKENS; do
        N=$((P * L))
        # At the first (shortest) length, where the ring's lead over PyTorch is thinnest, PyTorch
        # runs before the ring's rows as well as after: two rounds, whose spread is its A/A.
        [ "$L" = "$FIRST" ] && torch_rows "$P" "$N" "$CSV"
        for sharding in $SHARDINGS; do
            causal=$(mask_of "$sharding")
            echo "== $P GPUs, $N tokens, $sharding, causal $causal"
            "$BENCH" --gpus "$P" --sharding "$sharding" --causal "$causal" --len "$N" --heads "$HEADS" \
                --head-dim "$HEAD_DIM" --pass "$PASS" --repeats "$REPEATS" | tee -a "$CSV"
        done
        torch_rows "$P" "$N" "$CSV"
    done
    kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null; SAMPLER=""
    {
        echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "commit: $COMMIT"
        echo "gpus (the ring's: 0 .. $((P - 1))): $P of $VISIBLE, $GPU"
        system_lines "$PYTHON"
        echo "topology:"
        nvidia-smi topo -m 2>/dev/null | sed 's/^/  /'
        echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
        echo "shape: B = 1, H = $HEADS, D = $HEAD_DIM; tokens per GPU: $TOKENS; repeats: $REPEATS"
        echo "shardings: $SHARDINGS; passes: $PASS"
        echo "duration so far: $((SECONDS - START)) s"
        "$PYTHON" bench/clock_samples.py "$WORK/clocks-x$P.csv"
    } >"$WORK/system-x$P.txt"
    "$PYTHON" bench/ring_table.py "$CSV" --out "$WORK/table-x$P.txt" >/dev/null
    mv -f "$CSV" "$WORK/system-x$P.txt" "$WORK/table-x$P.txt" "$DEST/"
    echo "== $P GPUs: $DEST/ring-x$P.csv, table-x$P.txt, system-x$P.txt"
done
if ls "$DEST"/ring-x*.csv >/dev/null 2>&1; then
    "$PYTHON" bench/ring_plots.py "$DEST"/ring-x*.csv --out "$DEST/scaling.png" \
        --title "Ring attention, per GPU against its kernels alone at the ring's tokens per GPU, on every GPU at once"
fi
echo "== done in $((SECONDS - START)) s"
