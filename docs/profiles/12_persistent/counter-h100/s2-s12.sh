#!/bin/bash
# Stage 12 on branch ring-forward-12-counter (+ ring changes): suite, sanitize, then a driver A/B
# against main's stage 12 (.deps/ring/bench12_main) at long non-causal shapes (the counter's).
set -o pipefail
nvidia-smi -L | tee $OUT/gpus.txt
S=$SECONDS
make -j16 -C 12_persistent all > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
timeout 200 make -C 12_persistent test > $OUT/tests.log 2>&1; echo "tests rc $? at $((SECONDS-S)) s" | tee -a $OUT/tests.log
grep -E "^suite|test cases|FAILED|ERROR" $OUT/tests.log | tail -4
timeout 200 make -C 12_persistent sanitize > $OUT/sanitize.log 2>&1; echo "sanitize rc $? at $((SECONDS-S)) s" | tee -a $OUT/sanitize.log
tail -8 $OUT/sanitize.log
NEW=build/12_persistent/bench_12_persistent
OLD=.deps/ring/bench12_main
for round in 1 2 3; do
  for b in old new; do
    BIN=$OLD; [ $b = new ] && BIN=$NEW
    $BIN --shape 1,32,16384,16384,128 --shape 4,8,16384,16384,64 --shape 1,32,32768,32768,128 --shape 1,32,4096,4096,128 \
      --pass fwd --csv $OUT/ab-$b.csv --commit $b-$round > /dev/null 2>>$OUT/ab.log
  done
  echo "round $round at $((SECONDS-S)) s"
done
tar czf $OUT/out.tgz -C $OUT gpus.txt build.log tests.log sanitize.log ab-old.csv ab-new.csv ab.log
