#!/bin/bash
# Final check of main on one H100: make test over every suite, make sanitize of 10-12, make sass-check.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
make -j16 test > $OUT/make-test.log 2>&1; log "make test rc $?"
for s in 10_pingpong 11_hopper_backward 12_persistent; do
  make -C $s sanitize > $OUT/sanitize-$s.log 2>&1; log "sanitize $s rc $?"
done
make sass-check > $OUT/sass-check.log 2>&1; log "sass-check rc $?"
grep -E "passed|failed" $OUT/make-test.log | tail -20
grep -hE "^sanitize:" $OUT/sanitize-*.log
tail -3 $OUT/sass-check.log
