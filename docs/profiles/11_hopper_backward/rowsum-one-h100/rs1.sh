#!/bin/bash
# rowsum-one, call 1: 11_main = main (7b66a37 kernel); 11_hopper_backward = ones in consumer 0's dQ GEMM only (N = 72),
# consumer 1's N = 64; 11_vb = the same with the ones in consumer 1's. Stress (dQ, dK, dV against 11_main), two A/B runs.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv,noheader >> $OUT/timeline.txt
make -C 11_main -j16 all > /tmp/build-11_main.log 2>&1; for s in 11_hopper_backward 11_vb; do make -C $s -j16 all > /tmp/build-$s.log 2>&1 & done; wait; log "builds done"; ls build/11_*/*.so | wc -l
for s in 11_hopper_backward 11_vb; do timeout 45 python3 .deps/devscripts/pc_stress.py $s > $OUT/stress-$s.txt 2>&1; log "stress $s rc $?"; cat $OUT/stress-$s.txt; done
for r in 1 2; do
  timeout 140 python3 bench/driver.py --stages 11_main,11_hopper_backward,11_vb --sweep bf16-headline,extra,dpub --dtypes bf16 --no-torch-baselines --csv $OUT/ab$r.csv > /tmp/driver$r.log 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_hopper_backward 11_vb | tee $OUT/ratios$r.txt
done
(cd $OUT && tar czf all.tgz ab1.csv ab2.csv && rm -f ab1.csv ab2.csv)
