#!/bin/bash
# The ring on stage 12's forward: build, the suite, then an A/B of the forward against the ring as
# committed before (stage 11's forward; .deps/ring/bench_old, built at 6146d7b), alternating, with
# PyTorch's context parallelism in the same rounds at 128K per GPU.
set -o pipefail
nvidia-smi -L | tee $OUT/gpus.txt
export NCCL_NVLS_ENABLE=0
export NCCL_HOME=$(python3 -c "from importlib import metadata as m; print(m.distribution('nvidia-nccl-cu13').locate_file('nvidia/nccl'))")
S=$SECONDS
make -j16 -C 13_ring_attention all > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "built at $((SECONDS-S)) s"
ldd build/13_ring_attention/bench_13_ring_attention | grep -E "attention|nccl" | tee -a $OUT/build.log
timeout 200 make -C 13_ring_attention test > $OUT/tests.log 2>&1; echo "tests rc $? at $((SECONDS-S)) s" | tee -a $OUT/tests.log
grep -E "^suite|test cases|skipped \(|FAILED|ERROR" $OUT/tests.log | tail -8
NEW=build/13_ring_attention/bench_13_ring_attention
OLD=.deps/ring/bench_old
export LD_LIBRARY_PATH=$NCCL_HOME/lib
CSV=$OUT/ab.csv
$NEW --print-header > $CSV
run() { local tag=$1; shift; echo "== $tag $*" >> $OUT/ab.log; "$@" 2>>$OUT/ab.log | sed "s/^/$tag,/" >> $CSV; }
for round in 1 2; do
  run old $OLD --gpus 2 --sharding contiguous --len 262144 --causal 0 --pass fwd --repeats 3
  run new $NEW --gpus 2 --sharding contiguous --len 262144 --causal 0 --pass fwd --repeats 3
  echo "== torch round $round" >> $OUT/ab.log
  python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/torch_context_parallel.py --len 262144 \
     --heads 32 --head-dim 128 --causal 0 --repeats 2 --csv $OUT/torch.csv >> $OUT/ab.log 2>&1
  echo "round $round at $((SECONDS-S)) s"
done
for round in 1 2; do
  for sh in zigzag striped; do
    run old $OLD --gpus 2 --sharding $sh --len 131072 --causal 1 --pass fwd --repeats 3
    run new $NEW --gpus 2 --sharding $sh --len 131072 --causal 1 --pass fwd --repeats 3
  done
  run old $OLD --gpus 2 --sharding contiguous --len 65536 --causal 0 --pass fwd --repeats 3
  run new $NEW --gpus 2 --sharding contiguous --len 65536 --causal 0 --pass fwd --repeats 3
  echo "causal round $round at $((SECONDS-S)) s"
done
grep -v "^gpu," $CSV | cut -d, -f1,4,7,9,10,11,13,16,17,18 | column -t -s, | tee $OUT/ab.txt
