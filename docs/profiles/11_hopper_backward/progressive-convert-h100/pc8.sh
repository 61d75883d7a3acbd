#!/bin/bash
# Progressive conversion, call 8: the branch (BESIDE at compile time) and 11_pcX (call 7's runtime choice) beside main at the short shapes; suite, sanitize.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
for s in 11_main 11_hopper_backward 11_pcX; do make -C $s -j16 all > $OUT/build-$s.log 2>&1 & done; wait; log "builds done"
timeout 200 make -C 11_hopper_backward test > $OUT/test.log 2>&1; log "test rc $?"; tail -3 $OUT/test.log; grep -B3 -A8 "ERROR" $OUT/test.log | head -40
timeout 100 make -C 11_hopper_backward sanitize > $OUT/sanitize.log 2>&1; log "sanitize rc $?"; grep "^sanitize:" $OUT/sanitize.log | tee $OUT/sanitize-summary.txt
for r in 1 2; do
  timeout 120 python3 bench/driver.py --stages 11_main,11_hopper_backward,11_pcX --sweep pcshort --dtypes bf16 --csv $OUT/ab$r.csv > $OUT/driver$r.log 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_hopper_backward 11_pcX | tee $OUT/ratios$r.txt
done
(cd $OUT && tar czf all.tgz * && find . -type f ! -name all.tgz ! -name timeline.txt ! -name 'ratios*.txt' ! -name sanitize-summary.txt -delete)
