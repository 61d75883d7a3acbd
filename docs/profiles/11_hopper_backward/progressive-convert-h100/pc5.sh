#!/bin/bash
# Progressive conversion, next call (branch at 094f267 or later): suite (with test_11's long grids), sanitize,
# stress, spans at short and long shapes, two driver runs over the seqlen sweep beside main.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
for s in 11_main 11_hopper_backward; do make -C $s -j16 all > $OUT/build-$s.log 2>&1 & done; wait; log "builds done"
timeout 200 make -C 11_hopper_backward test > $OUT/test.log 2>&1; log "test rc $?"; tail -3 $OUT/test.log; grep -B3 -A8 "ERROR" $OUT/test.log | head -40
timeout 100 make -C 11_hopper_backward sanitize > $OUT/sanitize.log 2>&1; log "sanitize rc $?"; grep "^sanitize:" $OUT/sanitize.log | tee $OUT/sanitize-summary.txt
timeout 60 python3 .deps/devscripts/pc_stress.py 11_hopper_backward > $OUT/stress.txt 2>&1; log "stress rc $?"; tail -1 $OUT/stress.txt
SHORT=1 timeout 90 python3 .deps/devscripts/kprof2.py $OUT 11_main,11_hopper_backward > $OUT/spans.txt 2>&1; log "kprof2 rc $?"; grep "==" $OUT/spans.txt
for r in 1 2; do
  timeout 170 python3 bench/driver.py --stages 11_main,11_hopper_backward --sweep bf16-headline,extra,seqlen --dtypes bf16 --csv $OUT/ab$r.csv > $OUT/driver$r.log 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_hopper_backward | tee $OUT/ratios$r.txt
done
rm -f $OUT/trace.json
(cd $OUT && tar czf all.tgz * && find . -type f ! -name all.tgz ! -name timeline.txt ! -name 'ratios*.txt' ! -name spans.txt ! -name 'stress*.txt' ! -name sanitize-summary.txt -delete)
