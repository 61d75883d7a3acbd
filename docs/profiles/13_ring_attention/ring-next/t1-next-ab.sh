#!/bin/bash
# ring-next (merge loads + forward release + backward two sets) against main's ring (0250f78):
# suite on 4 GPUs, then alternating A/B rows. Binaries built on the dev machine.
set -o pipefail
S=$SECONDS
nvidia-smi -L | tee $OUT/gpus.txt
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv >> $OUT/gpus.txt
export NCCL_NVLS_ENABLE=0
export NCCL_HOME=$(python3 -c "from importlib import metadata as m; print(m.distribution('nvidia-nccl-cu13').locate_file('nvidia/nccl'))")
export LD_LIBRARY_PATH=$PWD/build/12_persistent:$NCCL_HOME/lib
cmp .deps/ring/bench_next build/13_ring_attention/bench_13_ring_attention && echo "bench_next is build/13's"
timeout 180 build/13_ring_attention/test_13_ring_attention > $OUT/tests.log 2>&1; echo "tests rc $? at $((SECONDS-S)) s" | tee -a $OUT/tests.log
grep -E "^suite|test cases|FAILED|ERROR" $OUT/tests.log | tail -8
OLD=.deps/ring/bench_main; NEW=.deps/ring/bench_next
CSV=$OUT/ab.csv
echo "build,$($NEW --print-header)" > $CSV
run() { local tag=$1; shift; echo "== $tag $*" >> $OUT/ab.log; "$@" 2>>$OUT/ab.log | sed "s/^/$tag,/" >> $CSV; }
pair() { run old $OLD "$@" --repeats 3; run new $NEW "$@" --repeats 3; }
for round in 1 2; do
  pair --gpus 4 --sharding striped --len 131072 --causal 1 --pass fwd
  pair --gpus 4 --sharding zigzag --len 131072 --causal 1 --pass fwd
  pair --gpus 2 --sharding zigzag --len 65536 --causal 1 --pass fwd
  pair --gpus 2 --sharding striped --len 65536 --causal 1 --pass fwd
  pair --gpus 4 --sharding contiguous --len 131072 --causal 0 --pass fwd
  pair --gpus 4 --sharding zigzag --len 131072 --causal 1 --pass bwd
  echo "round $round short rows at $((SECONDS-S)) s"
  pair --gpus 4 --sharding striped --len 524288 --causal 1 --pass fwd
  echo "round $round at $((SECONDS-S)) s"
  [ $((SECONDS-S)) -gt 250 ] && break
done
tar czf $OUT/out.tgz -C $OUT gpus.txt tests.log ab.csv ab.log
python3 docs/profiles/13_ring_attention/ring_ab.py $CSV "ring-next against main"
