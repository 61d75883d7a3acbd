#!/bin/bash
# kv-prefetch, call 1: 11_main = main's stage (6b5578f), 11_hopper_backward = the branch (the next round's K, V, Q, dO prefetched into L2).
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
for s in 11_main 11_hopper_backward; do make -C $s -j16 all > $OUT/build-$s.log 2>&1 & done; wait; log "builds done"
timeout 60 python3 .deps/devscripts/pc_stress.py 11_hopper_backward > $OUT/stress.txt 2>&1; log "stress rc $?"; tail -1 $OUT/stress.txt
for r in 1 2; do
  timeout 100 python3 bench/driver.py --stages 11_main,11_hopper_backward --sweep bf16-headline,extra,spre --dtypes bf16 --no-torch-baselines --csv $OUT/ab$r.csv > $OUT/driver$r.log 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_hopper_backward | grep -v "cuDNN" | tee $OUT/ratios$r.txt
done
timeout 200 make -C 11_hopper_backward test > $OUT/test.log 2>&1; log "test rc $?"; tail -3 $OUT/test.log; grep -B3 -A8 "ERROR" $OUT/test.log | head -30
timeout 90 make -C 11_hopper_backward sanitize > $OUT/sanitize.log 2>&1; log "sanitize rc $?"; grep "^sanitize:" $OUT/sanitize.log | tee $OUT/sanitize-summary.txt
(cd $OUT && tar czf all.tgz * && find . -type f ! -name all.tgz ! -name timeline.txt ! -name sanitize-summary.txt ! -name "ratios*.txt" -delete)
