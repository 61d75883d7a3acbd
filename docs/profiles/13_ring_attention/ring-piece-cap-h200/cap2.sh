#!/bin/bash
# Branch ring-piece-cap, call 2: 1,048,576 tokens on 4 GPUs (256K per GPU), repeats 1:
# contiguous non-causal capped / uncapped / PyTorch, then zigzag causal capped / uncapped.
set -o pipefail
export NCCL_NVLS_ENABLE=0
NCCL=$(python3 -c "from importlib import metadata as m; print(m.distribution('nvidia-nccl-cu13').locate_file('nvidia/nccl'))")
S=$SECONDS
N=1048576
{ nvidia-smi -L; } > $OUT/gpus2.txt 2>&1
make -j16 -C 13_ring_attention all NCCL_HOME=$NCCL > $OUT/build2.log 2>&1 || { tail -30 $OUT/build2.log; exit 1; }
B=build/13_ring_attention/bench_13_ring_attention; C=$OUT/cap-1m.csv
$B --print-header > $C
run() { [ $((SECONDS-S)) -gt $4 ] && { echo "skip $1 $2 $3 at $((SECONDS-S)) s"; return; }
  timeout 200 $B --gpus 4 --sharding $1 --causal $2 --len $N --heads 32 --head-dim 128 --repeats 1 --max-piece $3 2>>$OUT/err2.txt | sed "s/,ok$/,ok,cap$3/" >> $C
  echo "$1 causal $2 cap $3 rc $? at $((SECONDS-S)) s"; }
run contiguous 0 65536 300
run contiguous 0 0 400
timeout 130 python3 -m torch.distributed.run --standalone --nproc-per-node 4 bench/torch_context_parallel.py --len $N --heads 32 --head-dim 128 --causal 0 --repeats 1 --csv $C 2> $OUT/torch2.log
echo "torch rc $? at $((SECONDS-S)) s"
run zigzag 1 65536 480
run zigzag 1 0 530
cat $C | cut -d, -f2,3,6,8,9,10,13-17,20
tar czf $OUT/cap2.tgz -C $OUT gpus2.txt cap-1m.csv torch2.log err2.txt 2>/dev/null
