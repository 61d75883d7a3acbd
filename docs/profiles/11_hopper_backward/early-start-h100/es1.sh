#!/bin/bash
# Call 13: branch early-start (the main kernel's roles wait for the preprocessing only where they need it) beside main at 5c7e22c (11_main): the stress against main's gradients, two driver runs (no PyTorch baselines), six shapes.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv >> $OUT/log.txt
for s in 11_main 11_hopper_backward; do make -C $s -j16 all > /dev/null 2>&1 & done; wait; log "builds done"
timeout 60 python3 .deps/devscripts/pc_stress.py 11_hopper_backward > $OUT/stress.txt 2>&1; log "stress rc $?"; tail -1 $OUT/stress.txt
for r in 1 2; do
  timeout 80 python3 bench/driver.py --stages 11_main,11_hopper_backward --sweep pces --dtypes bf16 --no-torch-baselines --csv $OUT/ab$r.csv > /dev/null 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_hopper_backward | grep "|" | tee -a $OUT/log.txt
done
