#!/bin/bash
# Branch ring-piece-cap, call 1: build, the suite, then the A/B at 128K tokens per GPU (4 GPUs,
# contiguous, no mask): capped pieces (default) then --max-piece 0, repeats 3.
set -o pipefail
export NCCL_NVLS_ENABLE=0
NCCL=$(python3 -c "from importlib import metadata as m; print(m.distribution('nvidia-nccl-cu13').locate_file('nvidia/nccl'))")
S=$SECONDS
{ nvidia-smi -L; nvidia-smi --query-gpu=name,uuid,clocks.max.sm,power.limit --format=csv; } > $OUT/gpus.txt 2>&1
make -j16 -C 13_ring_attention all NCCL_HOME=$NCCL > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "built at $((SECONDS-S)) s"
timeout 260 make -C 13_ring_attention test NCCL_HOME=$NCCL > $OUT/tests.log 2>&1; echo "tests rc $? at $((SECONDS-S)) s" | tee -a $OUT/tests.log
grep -E "suite|passed|failed|FAIL|ERROR" $OUT/tests.log | tail -8
B=build/13_ring_attention/bench_13_ring_attention; C=$OUT/cap-512k.csv
$B --print-header > $C
for m in 65536 0 65536 0; do
  [ $((SECONDS-S)) -gt 470 ] && { echo "stop at $((SECONDS-S)) s"; break; }
  echo "max_piece=$m" >> $OUT/order.txt
  timeout 100 $B --gpus 4 --sharding contiguous --causal 0 --len 524288 --heads 32 --head-dim 128 --repeats 3 --max-piece $m 2>>$OUT/err.txt | sed "s/,ok$/,ok,cap$m/" >> $C
  echo "cap $m rc $? at $((SECONDS-S)) s"
done
cat $C | cut -d, -f2,3,6,9,10,13-17,20
tar czf $OUT/cap1.tgz -C $OUT gpus.txt build.log tests.log cap-512k.csv order.txt 2>/dev/null
