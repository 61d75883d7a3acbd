#!/bin/bash
# After the 2-GPU 128K bench: old/new A/B of the backward at 32K per GPU, and a backward trace.
export NCCL_NVLS_ENABLE=0
export NCCL_HOME=$(python3 -c "from importlib import metadata as m; print(m.distribution('nvidia-nccl-cu13').locate_file('nvidia/nccl'))")
export LD_LIBRARY_PATH=$NCCL_HOME/lib
make -C bench/experiments ring_trace > $OUT/trace-build.log 2>&1 || tail -5 $OUT/trace-build.log
mkdir -p $OUT/trace
build/experiments/ring_trace --gpus 2 --sharding zigzag --len 65536 --causal 1 --pass bwd --calls 3 --out $OUT/trace/bwd-zigzag-65536.csv > $OUT/trace/log 2>&1
python3 bench/experiments/ring_trace.py $OUT/trace/bwd-zigzag-65536.csv > $OUT/trace/summary.txt 2>&1
NEW=build/13_ring_attention/bench_13_ring_attention; OLD=.deps/ring/bench_old; CSV=$OUT/ab.csv
$NEW --print-header > $CSV
run() { local tag=$1; shift; "$@" 2>>$OUT/ab.log | sed "s/^/$tag,/" >> $CSV; }
for round in 1 2; do for sh in zigzag contiguous; do c=1; [ $sh = contiguous ] && c=0
  run old $OLD --gpus 2 --sharding $sh --len 65536 --causal $c --pass bwd --repeats 3
  run new $NEW --gpus 2 --sharding $sh --len 65536 --causal $c --pass bwd --repeats 3
done; done
tar czf $OUT/extra.tgz -C $OUT trace ab.csv ab.log
