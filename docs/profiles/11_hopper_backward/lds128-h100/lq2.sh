#!/bin/bash
# lds128, call 2 (the layout without bank conflicts; no suite): 11_main = main (fb5936d kernel), 11_hopper_backward = LSE and delta in fragment order, read by LDS.128.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader >> $OUT/timeline.txt
make -C 11_main -j16 all > /tmp/build-11_main.log 2>&1; for s in 11_hopper_backward; do make -C $s -j16 all > /tmp/build-$s.log 2>&1 & done; wait; log "builds done"; ls build/11_*/*.so | wc -l
timeout 40 python3 .deps/devscripts/pc_stress.py 11_hopper_backward > $OUT/stress.txt 2>&1; log "stress rc $?"; tail -1 $OUT/stress.txt
for r in 1 2; do
  timeout 120 python3 bench/driver.py --stages 11_main,11_hopper_backward --sweep bf16-headline,extra,dpub --dtypes bf16 --no-torch-baselines --csv $OUT/ab$r.csv > /tmp/driver$r.log 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_hopper_backward | grep -v "cuDNN" | tee $OUT/ratios$r.txt
done
(cd $OUT && tar czf all.tgz ab1.csv ab2.csv && rm -f ab1.csv ab2.csv)
