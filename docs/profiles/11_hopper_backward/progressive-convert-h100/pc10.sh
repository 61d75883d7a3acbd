#!/bin/bash
# Call 12: what the main kernel's 1% beside the conversion is: 11_pcA (no wait for the reduce-adds' completion before the count: racy, timing only), 11_pcB (the spin sleeps 1000 ns), beside main at e364428 and 11_main.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
for s in 11_main 11_hopper_backward 11_pcA 11_pcB; do make -C $s -j16 all > $OUT/build-$s.log 2>&1 & done; wait; log "builds done"
for r in 1 2; do
  timeout 100 python3 bench/driver.py --stages 11_main,11_hopper_backward,11_pcA,11_pcB --sweep pclong --dtypes bf16 --no-torch-baselines --csv $OUT/ab$r.csv > $OUT/driver$r.log 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_hopper_backward 11_pcA 11_pcB | tee $OUT/ratios$r.txt
done
