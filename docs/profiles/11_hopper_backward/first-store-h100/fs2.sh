#!/bin/bash
# first-store, call 2: 11_main = main (fb5936d kernel), 11_hopper_backward = the branch: dQ zeroed in the main kernel by a zeroer warp per block, tiles claimed.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader >> $OUT/timeline.txt
for s in 11_main 11_hopper_backward; do make -C $s -j16 all > /tmp/build-$s.log 2>&1 & done; wait; log "builds done"; grep -i error /tmp/build-11_hopper_backward.log | head -3
timeout 40 python3 .deps/devscripts/pc_stress.py 11_hopper_backward > $OUT/stress.txt 2>&1; log "stress rc $?"; tail -1 $OUT/stress.txt
for r in 1 2; do
  timeout 80 python3 bench/driver.py --stages 11_main,11_hopper_backward --sweep bf16-headline,extra,dpub --dtypes bf16 --no-torch-baselines --csv $OUT/ab$r.csv > /tmp/driver$r.log 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_hopper_backward | grep -v "cuDNN" | tee $OUT/ratios$r.txt
done
timeout 60 python3 .deps/devscripts/kprof2.py $OUT 11_main,11_hopper_backward > $OUT/spans.txt 2>&1; log "kprof2 rc $?"; grep "==" $OUT/spans.txt; rm -f $OUT/trace.json
timeout 200 make -C 11_hopper_backward test > /tmp/test.log 2>&1; log "test rc $?"; tail -4 /tmp/test.log | tee $OUT/test-tail.txt; grep -B2 -A6 "ERROR" /tmp/test.log | head -30 | tee -a $OUT/test-tail.txt
timeout 150 make -C 11_hopper_backward sanitize > /tmp/sanitize.log 2>&1; log "sanitize rc $?"; grep "^sanitize:" /tmp/sanitize.log | tee $OUT/sanitize-summary.txt
(cd $OUT && cp /tmp/test.log /tmp/sanitize.log . && tar czf all.tgz *.log *.csv && rm -f *.log *.csv)
ls $OUT
