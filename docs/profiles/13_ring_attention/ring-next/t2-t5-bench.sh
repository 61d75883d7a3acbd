#!/bin/bash
# make bench-ring for one GPU count and some per-GPU lengths: bench.sh P "tokens" repeats tag commit
set -o pipefail
S=$SECONDS
P=$1; T=$2; R=$3; TAG=$4; C=$5
nvidia-smi -L | tee $OUT/gpus-$TAG.txt
export NCCL_NVLS_ENABLE=0
export NCCL_HOME=$(python3 -c "from importlib import metadata as m; print(m.distribution('nvidia-nccl-cu13').locate_file('nvidia/nccl'))")
export LD_LIBRARY_PATH=$NCCL_HOME/lib
RING_GPUS=$P RING_TOKENS_PER_GPU="$T" RING_REPEATS=$R BENCH_COMMIT=$C PYTHON=python3 NCCL_HOME=$NCCL_HOME \
  make --no-print-directory bench-ring > $OUT/bench-$TAG.log 2>&1; echo "bench rc $? at $((SECONDS-S)) s" | tee -a $OUT/bench-$TAG.log
G=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+|-+$//g')
mkdir -p $OUT/$TAG
cp bench/results/$G/ring/ring-x$P.csv bench/results/$G/ring/system-x$P.txt bench/results/$G/ring/table-x$P.txt $OUT/$TAG/ 2>/dev/null
tar czf $OUT/$TAG.tgz -C $OUT $TAG bench-$TAG.log gpus-$TAG.txt
grep -E "^==|error|rc" $OUT/bench-$TAG.log | tail -6
cat $OUT/$TAG/table-x$P.txt | head -40
