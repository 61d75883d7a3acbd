#!/bin/bash
# Probe: the compact layout with one staging tile in use (11_one) beside the branch (two) and main's stage 11.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
build/11_one/test_11_one -tc="*eterministic*" > $OUT/tests-one.log 2>&1; log "tests 11_one rc $?"
tail -3 $OUT/tests-one.log
for r in 1 2; do
  python3 bench/driver.py --stages 11_main,11_hopper_backward,11_one --sweep bf16-headline,extra --dtypes bf16 \
    --csv $OUT/ab$r.csv --deterministic-file $OUT/det$r.txt --no-torch-baselines > $OUT/driver$r.log 2>&1; log "driver $r rc $?"
  cat $OUT/det$r.txt
done
