#!/bin/bash
# Forward traces of the ring at 2f88100 on 2 GPUs, 32K per GPU (the two rows level with PyTorch).
S=$SECONDS
nvidia-smi -L | tee $OUT/gpus.txt
export NCCL_NVLS_ENABLE=0
export NCCL_HOME=$(python3 -c "from importlib import metadata as m; print(m.distribution('nvidia-nccl-cu13').locate_file('nvidia/nccl'))")
export LD_LIBRARY_PATH=$PWD/build/12_persistent:$NCCL_HOME/lib
mkdir -p $OUT/trace
for spec in "striped 65536 1" "zigzag 65536 1" "contiguous 65536 0"; do
  set -- $spec
  timeout 60 build/experiments/ring_trace --gpus 2 --sharding $1 --len $2 --causal $3 --pass fwd --calls 3 \
    --out $OUT/trace/fwd-$1-$2.csv > $OUT/trace/fwd-$1-$2.log 2>&1 || tail -5 $OUT/trace/fwd-$1-$2.log
  echo "$1 at $((SECONDS-S)) s"
done
python3 bench/experiments/ring_trace.py $OUT/trace/fwd-*.csv > $OUT/trace/summary.txt 2>&1
tar czf $OUT/trace.tgz -C $OUT gpus.txt trace
cat $OUT/trace/summary.txt | head -120
