#!/bin/bash
# Branch ring-held (main + variant-held-partial.patch) on four GPUs: the suite, then alternating
# forward rows against main's ring (2f88100's build) at 32K tokens per GPU.
set -o pipefail
S=$SECONDS
nvidia-smi -L | tee $OUT/gpus.txt
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv >> $OUT/gpus.txt
export NCCL_NVLS_ENABLE=0
export NCCL_HOME=$(python3 -c "from importlib import metadata as m; print(m.distribution('nvidia-nccl-cu13').locate_file('nvidia/nccl'))")
export LD_LIBRARY_PATH=$PWD/build/12_persistent:$NCCL_HOME/lib
cmp .deps/ring/bench_held build/13_ring_attention/bench_13_ring_attention && echo "bench_held is build/13's"
timeout 180 build/13_ring_attention/test_13_ring_attention > $OUT/tests.log 2>&1; echo "tests rc $? at $((SECONDS-S)) s" | tee -a $OUT/tests.log
grep -E "^suite|test cases|FAILED|ERROR" $OUT/tests.log | tail -8
OLD=.deps/ring/bench_next; NEW=.deps/ring/bench_held
CSV=$OUT/ab.csv
echo "build,$($NEW --print-header)" > $CSV
run() { local tag=$1; shift; echo "== $tag $*" >> $OUT/ab.log; "$@" 2>>$OUT/ab.log | sed "s/^/$tag,/" >> $CSV; }
pair() { run old $OLD "$@" --repeats 3; run new $NEW "$@" --repeats 3; }
for round in 1 2 3; do
  pair --gpus 4 --sharding striped --len 131072 --causal 1 --pass fwd
  pair --gpus 4 --sharding zigzag --len 131072 --causal 1 --pass fwd
  pair --gpus 4 --sharding contiguous --len 131072 --causal 0 --pass fwd
  echo "round $round at $((SECONDS-S)) s"
  [ $((SECONDS-S)) -gt 200 ] && break
done
tar czf $OUT/out.tgz -C $OUT gpus.txt tests.log ab.csv ab.log
python3 docs/profiles/13_ring_attention/ring_ab.py $CSV "ring-held against 2f88100, four GPUs"
