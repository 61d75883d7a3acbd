#!/bin/bash
# Progressive conversion, call 2: per-head (11_pc1 claimed, 11_pc2 a block a tile) and per-tile
# (11_hopper_backward) counters beside main: suite of the per-tile one, stress, timeline, one driver run.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
for s in 11_main 11_pc1 11_pc2 11_hopper_backward; do make -C $s -j16 all > $OUT/build-$s.log 2>&1 & done; wait; log "builds done"
timeout 240 make -C 11_hopper_backward test > $OUT/test.log 2>&1; log "test rc $?"; tail -3 $OUT/test.log; grep -B3 -A8 "ERROR" $OUT/test.log | head -40
for s in 11_hopper_backward 11_pc2; do timeout 100 python3 .deps/devscripts/pc_stress.py $s > $OUT/stress-$s.txt 2>&1; log "stress $s rc $?"; tail -1 $OUT/stress-$s.txt; done
timeout 150 python3 .deps/devscripts/kprof2.py $OUT 11_main,11_pc1,11_pc2,11_hopper_backward > $OUT/spans.txt 2>&1; log "kprof2 rc $?"; grep "==" $OUT/spans.txt
timeout 200 python3 bench/driver.py --stages 11_main,11_pc1,11_pc2,11_hopper_backward --sweep bf16-headline,extra --dtypes bf16 --csv $OUT/ab1.csv > $OUT/driver1.log 2>&1; log "driver rc $?"
python3 .deps/devscripts/ab_ratios.py $OUT/ab1.csv 11_pc1 11_pc2 11_hopper_backward | tee $OUT/ratios1.txt
rm -f $OUT/trace.json
(cd $OUT && tar czf all.tgz * && find . -type f ! -name all.tgz ! -name timeline.txt ! -name 'ratios*.txt' ! -name spans.txt ! -name 'stress*.txt' -delete)
