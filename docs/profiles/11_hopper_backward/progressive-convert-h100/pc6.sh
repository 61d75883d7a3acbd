#!/bin/bash
# Progressive conversion, call 7: main's conversion geometry, a block spinning per 256 float4s; suite, stress, spans, two driver runs (pcab) beside main.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
for s in 11_main 11_hopper_backward; do make -C $s -j16 all > $OUT/build-$s.log 2>&1 & done; wait; log "builds done"
timeout 200 make -C 11_hopper_backward test > $OUT/test.log 2>&1; log "test rc $?"; tail -3 $OUT/test.log; grep -B3 -A8 "ERROR" $OUT/test.log | head -40
timeout 60 python3 .deps/devscripts/pc_stress.py 11_hopper_backward > $OUT/stress.txt 2>&1; log "stress rc $?"; tail -1 $OUT/stress.txt
SHORT=1 timeout 90 python3 .deps/devscripts/kprof2.py $OUT 11_main,11_hopper_backward > $OUT/spans.txt 2>&1; log "kprof2 rc $?"; grep "==" $OUT/spans.txt
for r in 1 2; do
  timeout 140 python3 bench/driver.py --stages 11_main,11_hopper_backward --sweep bf16-headline,pcab --dtypes bf16 --csv $OUT/ab$r.csv > $OUT/driver$r.log 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_hopper_backward | tee $OUT/ratios$r.txt
done
rm -f $OUT/trace.json
(cd $OUT && tar czf all.tgz * && find . -type f ! -name all.tgz ! -name timeline.txt ! -name 'ratios*.txt' ! -name spans.txt ! -name 'stress*.txt' -delete)
