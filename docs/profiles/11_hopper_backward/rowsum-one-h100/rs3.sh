#!/bin/bash
# rowsum-one, call 3: 11_hopper_backward = ones in consumer 0's dQ GEMM only, the consumers meeting by arrive/sync pairs.
# The suite, make sanitize (stage 11), one A/B run against 11_main.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv,noheader >> $OUT/timeline.txt
make -C 11_main -j16 all > /tmp/build-11_main.log 2>&1; make -C 11_hopper_backward -j16 all > /tmp/build-11.log 2>&1; log "builds done"
timeout 45 python3 .deps/devscripts/pc_stress.py 11_hopper_backward > $OUT/stress.txt 2>&1; log "stress rc $?"; tail -1 $OUT/stress.txt
timeout 200 make -C 11_hopper_backward test > $OUT/test.log 2>&1; log "suite rc $?"; grep -E "test cases|Status" $OUT/test.log | tail -2
timeout 250 make -C 11_hopper_backward sanitize > $OUT/sanitize.log 2>&1; log "sanitize rc $?"; grep "^sanitize:" $OUT/sanitize.log
for r in 1 2; do
timeout 100 python3 bench/driver.py --stages 11_main,11_hopper_backward --sweep bf16-headline,extra,dpub --dtypes bf16 --no-torch-baselines --csv $OUT/ab$r.csv > $OUT/driver$r.log 2>&1; log "driver $r rc $?"
python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_hopper_backward | grep -v cuDNN | tee $OUT/ratios$r.txt
done
