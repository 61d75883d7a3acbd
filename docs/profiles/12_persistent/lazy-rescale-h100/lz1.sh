#!/bin/bash
# Branch lazy-rescale: stage 12's suite and sanitizers, sass-check on the device's build, then two driver runs of
# main's stage 12 (12_main) beside it over make bench's BF16 sweeps (no PyTorch baselines).
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
build/12_persistent/test_12_persistent > $OUT/tests.log 2>&1; log "tests rc $?"
tail -3 $OUT/tests.log
make -C 12_persistent sanitize > $OUT/sanitize.log 2>&1; log "sanitize rc $?"
grep -h "^sanitize:" $OUT/sanitize.log
for r in 1 2; do
  python3 bench/driver.py --stages 12_main,12_persistent --sweep bf16-headline,extra,seqlen --dtypes bf16 \
    --csv $OUT/ab$r.csv --no-torch-baselines > $OUT/driver$r.log 2>&1; log "driver $r rc $?"
done
