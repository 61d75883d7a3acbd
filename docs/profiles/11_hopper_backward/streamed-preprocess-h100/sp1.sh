#!/bin/bash
# streamed-preprocess, call 1: 11_main = main's stage (7bea50d), 11_hopper_backward = the branch
# (divisor 4: 33 SMs), 11_sp2 = the branch with divisor 2 (66 SMs).
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
for s in 11_main 11_hopper_backward 11_sp2; do make -C $s -j16 all > $OUT/build-$s.log 2>&1 & done; wait; log "builds done"
timeout 90 python3 .deps/devscripts/pc_stress.py 11_hopper_backward > $OUT/stress.txt 2>&1; log "stress rc $?"; tail -1 $OUT/stress.txt
for r in 1 2; do
  timeout 120 python3 bench/driver.py --stages 11_main,11_hopper_backward,11_sp2 --sweep bf16-headline,extra,spre --dtypes bf16 --no-torch-baselines --csv $OUT/ab$r.csv > $OUT/driver$r.log 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_hopper_backward 11_sp2 | grep -v "cuDNN" | tee $OUT/ratios$r.txt
done
timeout 200 make -C 11_hopper_backward test > $OUT/test.log 2>&1; log "test rc $?"; tail -3 $OUT/test.log; grep -B3 -A8 "ERROR" $OUT/test.log | head -40
timeout 150 make -C 11_hopper_backward sanitize > $OUT/sanitize.log 2>&1; log "sanitize rc $?"; grep "^sanitize:" $OUT/sanitize.log | tee $OUT/sanitize-summary.txt
timeout 60 python3 .deps/devscripts/kprof2.py $OUT 11_main,11_hopper_backward > $OUT/spans.txt 2>&1; log "kprof2 rc $?"; grep "==" $OUT/spans.txt
rm -f $OUT/trace.json
(cd $OUT && tar czf all.tgz * && find . -type f ! -name all.tgz ! -name timeline.txt ! -name spans.txt ! -name sanitize-summary.txt ! -name "ratios*.txt" -delete)
