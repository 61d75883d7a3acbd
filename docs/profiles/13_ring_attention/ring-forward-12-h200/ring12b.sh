#!/bin/bash
# After the gather reorder: build, the suite, then old/new A/B of the forward (no PyTorch).
set -o pipefail
nvidia-smi -L | tee $OUT/gpus.txt
export NCCL_NVLS_ENABLE=0
export NCCL_HOME=$(python3 -c "from importlib import metadata as m; print(m.distribution('nvidia-nccl-cu13').locate_file('nvidia/nccl'))")
S=$SECONDS
make -j16 -C 13_ring_attention all > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "built at $((SECONDS-S)) s"
timeout 120 make -C 13_ring_attention test > $OUT/tests.log 2>&1; echo "tests rc $? at $((SECONDS-S)) s" | tee -a $OUT/tests.log
grep -E "^suite|FAILED|ERROR" $OUT/tests.log | tail -4
NEW=build/13_ring_attention/bench_13_ring_attention
OLD=.deps/ring/bench_old
export LD_LIBRARY_PATH=$NCCL_HOME/lib
CSV=$OUT/ab.csv
run() { local tag=$1; shift; echo "== $tag $*" >> $OUT/ab.log; "$@" 2>>$OUT/ab.log | sed "s/^/$tag,/" >> $CSV; }
for round in 1 2; do
  run old $OLD --gpus 2 --sharding striped --len 131072 --causal 1 --pass fwd --repeats 3
  run new $NEW --gpus 2 --sharding striped --len 131072 --causal 1 --pass fwd --repeats 3
  run old $OLD --gpus 2 --sharding zigzag --len 131072 --causal 1 --pass fwd --repeats 3
  run new $NEW --gpus 2 --sharding zigzag --len 131072 --causal 1 --pass fwd --repeats 3
  echo "round $round at $((SECONDS-S)) s"
  [ $((SECONDS-S)) -gt 120 ] && break
done
cut -d, -f1,4,7,9,10,11,12 $CSV
