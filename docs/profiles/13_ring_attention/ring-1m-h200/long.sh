#!/bin/bash
# The ring at 1,048,576 tokens on 4 GPUs (256K per GPU), beside PyTorch's context parallelism:
# $1 = causal (zigzag and striped) or noncausal (contiguous); $2 = repeats.
set -o pipefail
export NCCL_NVLS_ENABLE=0
NCCL=$(python3 -c "from importlib import metadata as m; print(m.distribution('nvidia-nccl-cu13').locate_file('nvidia/nccl'))")
S=$SECONDS
N=1048576; R=${2:-2}
{ nvidia-smi -L; nvidia-smi --query-gpu=name,uuid,clocks.max.sm,power.limit --format=csv; } > $OUT/gpus-$1.txt 2>&1
make -j16 -C 13_ring_attention all NCCL_HOME=$NCCL > $OUT/build-$1.log 2>&1 || { tail -30 $OUT/build-$1.log; exit 1; }
echo "built at $((SECONDS-S)) s"
B=build/13_ring_attention/bench_13_ring_attention; C=$OUT/ring-x4-1m-$1.csv
$B --print-header > $C
if [ "$1" = causal ]; then SETS="zigzag:1 striped:1"; TC=1; else SETS="contiguous:0"; TC=0; fi
for s in $SETS; do sh=${s%:*}; c=${s#*:}
  timeout 250 $B --gpus 4 --sharding $sh --causal $c --len $N --heads 32 --head-dim 128 --repeats $R >> $C 2>>$OUT/err-$1.txt
  echo "$sh rc $? at $((SECONDS-S)) s"
done
timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node 4 bench/torch_context_parallel.py --len $N --heads 32 --head-dim 128 --causal $TC --repeats $R --csv $C 2> $OUT/torch-$1.log
echo "torch rc $? at $((SECONDS-S)) s"
cat $C
