#!/bin/bash
# Stage 11 A/B/C: main's as 11_main, VARIANTS (space-separated stage folders) beside it: build, each variant's
# suite, optional sanitize of the first (SANITIZE=1), then two driver runs with all in the same turns.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
for s in 11_main $VARIANTS; do make -C $s -j16 all > $OUT/build-$s.log 2>&1 & done; wait; log "builds done"
for s in $VARIANTS; do grep -A2 flash_backward build/$s/build.log | grep spill > $OUT/spills-$s.txt; done
for s in $VARIANTS; do make -C $s test > $OUT/test-$s.log 2>&1; log "test $s rc $?"; tail -3 $OUT/test-$s.log; done
if [ "$SANITIZE" = 1 ]; then first=${VARIANTS%% *}; make -C $first sanitize $SANITIZE_ARGS > $OUT/sanitize-$first.log 2>&1; log "sanitize $first rc $?"; grep "^sanitize:" $OUT/sanitize-$first.log; fi
stages=11_main,$(echo $VARIANTS | tr ' ' ',')
for r in 1 2; do
  python3 bench/driver.py --stages $stages --sweep bf16-headline,extra --dtypes bf16 --csv $OUT/ab$r.csv > $OUT/driver$r.log 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv $VARIANTS | tee $OUT/ratios$r.txt
done
