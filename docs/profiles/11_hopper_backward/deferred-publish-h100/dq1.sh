#!/bin/bash
# dq-first, call 8: 11_main = main (b03539a, fb5936d's kernel), 11_vb = dQ first + late publish at D = 128, 11_hopper_backward = dQ first, published at once.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader >> $OUT/timeline.txt
for s in 11_main 11_vb 11_hopper_backward; do make -C $s -j16 all > /tmp/build-$s.log 2>&1 & done; wait; log "builds done"; grep -i error /tmp/build-11_hopper_backward.log | head -3
for v in 11_vb 11_hopper_backward; do timeout 40 python3 .deps/devscripts/pc_stress.py $v > $OUT/stress-$v.txt 2>&1; log "stress $v rc $?"; tail -1 $OUT/stress-$v.txt; done
for r in 1 2; do
  timeout 100 python3 bench/driver.py --stages 11_main,11_vb,11_hopper_backward --sweep bf16-headline,extra,dpub --dtypes bf16 --no-torch-baselines --csv $OUT/ab$r.csv > /tmp/driver$r.log 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_vb 11_hopper_backward | grep -v "cuDNN" | tee $OUT/ratios$r.txt
done
