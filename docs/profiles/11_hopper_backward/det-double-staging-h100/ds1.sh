#!/bin/bash
# Branch det-double-staging: stage 11's suite and sanitizers, then two driver runs of main's stage 11 (11_main) beside it.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
build/11_hopper_backward/test_11_hopper_backward > $OUT/tests.log 2>&1; log "tests rc $?"
tail -4 $OUT/tests.log
make -C 11_hopper_backward sanitize > $OUT/sanitize.log 2>&1; log "sanitize rc $?"
grep -h "^sanitize:" $OUT/sanitize.log
for r in 1 2; do
  python3 bench/driver.py --stages 11_main,11_hopper_backward --sweep bf16-headline,extra --dtypes bf16 \
    --csv $OUT/ab$r.csv --deterministic-file $OUT/det$r.txt --no-torch-baselines > $OUT/driver$r.log 2>&1; log "driver $r rc $?"
  cat $OUT/det$r.txt
done
