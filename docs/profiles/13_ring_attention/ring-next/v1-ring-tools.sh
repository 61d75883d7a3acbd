#!/bin/bash
# make bench-ring's RING_SHARDINGS / RING_PASS and clock sampler on two GPUs: one short run.
set -o pipefail
S=$SECONDS
nvidia-smi -L | tee $OUT/gpus.txt
export NCCL_NVLS_ENABLE=0
export NCCL_HOME=$(python3 -c "from importlib import metadata as m; print(m.distribution('nvidia-nccl-cu13').locate_file('nvidia/nccl'))")
export LD_LIBRARY_PATH=$PWD/build/12_persistent:$NCCL_HOME/lib
RING_GPUS=2 RING_TOKENS_PER_GPU=32768 RING_REPEATS=1 RING_SHARDINGS="zigzag contiguous" RING_PASS=bwd \
  BENCH_COMMIT=$1 PYTHON=python3 NCCL_HOME=$NCCL_HOME \
  make --no-print-directory bench-ring > $OUT/bench.log 2>&1; echo "bench rc $? at $((SECONDS-S)) s" | tee -a $OUT/bench.log
G=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+|-+$//g')
mkdir -p $OUT/ring
cp bench/results/$G/ring/ring-x2.csv bench/results/$G/ring/system-x2.txt bench/results/$G/ring/table-x2.txt bench/results/$G/ring/scaling.png $OUT/ring/ 2>/dev/null
tail -5 $OUT/bench.log
