#!/bin/bash
# rowsum-one, call 2: call 1 timed 11_vb under 11_hopper_backward's name (its caps name). Now: 11_hopper_backward = ones in
# consumer 0's dQ GEMM only, 11_vb = in consumer 1's; two A/B runs, both suites, and make sanitize for 11_hopper_backward.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv,noheader >> $OUT/timeline.txt
make -C 11_main -j16 all > /tmp/build-11_main.log 2>&1; for s in 11_hopper_backward 11_vb; do make -C $s -j16 all > /tmp/build-$s.log 2>&1 & done; wait; log "builds done"; ls build/11_*/*.so | wc -l
for r in 1 2; do
  timeout 140 python3 bench/driver.py --stages 11_main,11_hopper_backward,11_vb --sweep bf16-headline,extra,dpub --dtypes bf16 --no-torch-baselines --csv $OUT/ab$r.csv > $OUT/driver$r.log 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_hopper_backward 11_vb | grep -v cuDNN | tee $OUT/ratios$r.txt
done
(cd $OUT && tar czf all.tgz ab1.csv ab2.csv && rm -f ab1.csv ab2.csv)
for s in 11_hopper_backward 11_vb; do timeout 200 make -C $s test > $OUT/test-$s.log 2>&1 & done; wait; log "suites done"
for s in 11_hopper_backward 11_vb; do grep -E "test cases|Status" $OUT/test-$s.log | tail -2; done
timeout 200 make -C 11_hopper_backward sanitize > $OUT/sanitize.log 2>&1; log "sanitize rc $?"; grep "^sanitize:" $OUT/sanitize.log
