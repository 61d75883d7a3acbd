#!/bin/bash
# Branch lazy-rescale beside main's stage 12 twice (12_main, 12_main2: the same code, an A/A), two driver runs.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
for r in 1 2; do
  python3 bench/driver.py --stages 12_main,12_persistent,12_main2 --sweep bf16-headline,extra,seqlen --dtypes bf16 \
    --csv $OUT/aa$r.csv --no-torch-baselines > $OUT/driver$r.log 2>&1; log "driver $r rc $?"
done
