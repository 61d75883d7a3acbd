#!/bin/bash
# Branch ring-bwd-bf16-hop (stage 12 forward + counter + bf16 last hop): build, suite, backward
# traces, then old (.deps/ring/bench_old: main's ring at 6146d7b) / new A/B, fwd and bwd.
set -o pipefail
nvidia-smi -L | tee $OUT/gpus.txt
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv >> $OUT/gpus.txt
export NCCL_NVLS_ENABLE=0
export NCCL_HOME=$(python3 -c "from importlib import metadata as m; print(m.distribution('nvidia-nccl-cu13').locate_file('nvidia/nccl'))")
export LD_LIBRARY_PATH=$NCCL_HOME/lib
S=$SECONDS
make -j16 -C 13_ring_attention all > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
make -C bench/experiments ring_trace >> $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "built at $((SECONDS-S)) s"
timeout 200 make -C 13_ring_attention test > $OUT/tests.log 2>&1; echo "tests rc $? at $((SECONDS-S)) s" | tee -a $OUT/tests.log
grep -E "^suite|test cases|skipped \(|FAILED|ERROR" $OUT/tests.log | tail -8
mkdir -p $OUT/trace
for spec in "zigzag 65536 1 3" "contiguous 65536 0 3" "zigzag 262144 1 2"; do
  set -- $spec
  build/experiments/ring_trace --gpus 2 --sharding $1 --len $2 --causal $3 --pass bwd --calls $4 \
    --out $OUT/trace/bwd-$1-$2.csv > $OUT/trace/bwd-$1-$2.log 2>&1 || tail -5 $OUT/trace/bwd-$1-$2.log
done
python3 bench/experiments/ring_trace.py $OUT/trace/bwd-*.csv > $OUT/trace/summary.txt 2>&1; echo "traced at $((SECONDS-S)) s"
NEW=build/13_ring_attention/bench_13_ring_attention
OLD=.deps/ring/bench_old
CSV=$OUT/ab.csv
$NEW --print-header > $CSV
run() { local tag=$1; shift; echo "== $tag $*" >> $OUT/ab.log; "$@" 2>>$OUT/ab.log | sed "s/^/$tag,/" >> $CSV; }
pair() { run old $OLD --gpus 2 "$@" --repeats 3; run new $NEW --gpus 2 "$@" --repeats 3; }
for round in 1 2; do
  pair --sharding zigzag --len 65536 --causal 1 --pass bwd
  pair --sharding contiguous --len 65536 --causal 0 --pass bwd
  pair --sharding zigzag --len 262144 --causal 1 --pass bwd
  pair --sharding contiguous --len 262144 --causal 0 --pass fwd
  pair --sharding zigzag --len 131072 --causal 1 --pass fwd
  pair --sharding striped --len 131072 --causal 1 --pass fwd
  pair --sharding contiguous --len 65536 --causal 0 --pass fwd
  echo "round $round at $((SECONDS-S)) s"
  [ $((SECONDS-S)) -gt 330 ] && break
done
grep -v "^gpu," $CSV | cut -d, -f1,4,7,9,10,11,13,16,17,18 | column -t -s, > $OUT/ab.txt
tar czf $OUT/out.tgz -C $OUT gpus.txt build.log tests.log trace ab.csv ab.log ab.txt
cat $OUT/trace/summary.txt | head -80
