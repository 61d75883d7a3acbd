#!/bin/bash
# early-start, call 2 (run on the branch early-start, 11_main = main's stage): the FP64 suite, make sanitize, the spans beside main.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
git log --oneline -1 > $OUT/commit.txt
for s in 11_main 11_hopper_backward; do make -C $s -j16 all > $OUT/build-$s.log 2>&1 & done; wait; log "builds done"
timeout 220 make -C 11_hopper_backward test > $OUT/test.log 2>&1; log "test rc $?"; tail -3 $OUT/test.log; grep -B3 -A8 "ERROR" $OUT/test.log | head -40
timeout 120 make -C 11_hopper_backward sanitize > $OUT/sanitize.log 2>&1; log "sanitize rc $?"; grep "^sanitize:" $OUT/sanitize.log | tee $OUT/sanitize-summary.txt
SHORT=1 timeout 90 python3 .deps/devscripts/kprof2.py $OUT 11_main,11_hopper_backward > $OUT/spans.txt 2>&1; log "kprof2 rc $?"; grep "==" $OUT/spans.txt
rm -f $OUT/trace.json

# and the pair in the same turns at the shapes where the deterministic mode is timed (with the PyTorch baselines: cuDNN's ratio)
for r in 1 2; do
  timeout 150 python3 bench/driver.py --stages 11_main,11_hopper_backward --sweep bf16-headline,extra --dtypes bf16 --csv $OUT/ab$r.csv > $OUT/driver$r.log 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_hopper_backward | tee $OUT/ratios$r.txt
done
(cd $OUT && tar czf all.tgz * && find . -type f ! -name all.tgz ! -name timeline.txt ! -name spans.txt ! -name sanitize-summary.txt ! -name "ratios*.txt" -delete)
