#!/bin/bash
# first-store, call 3: where the zeroer-warp variant's time goes. 11_main = main (fb5936d kernel); 11_hopper_backward = call 2's
# variant; 11_va = without the writers' proxy fence; 11_vb = without the writers' wait (acquire + fence) at all; 11_vc = no
# zeroer and no wait (dQ never zeroed: wrong, the time of not zeroing alone). va-vc are for timing only.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader >> $OUT/timeline.txt
make -C 11_main -j16 all > /tmp/build-11_main.log 2>&1; for s in 11_hopper_backward 11_va 11_vb 11_vc; do make -C $s -j16 all > /tmp/build-$s.log 2>&1 & done; wait; log "builds done"; ls build/11_*/*.so; tail -3 /tmp/build-11_vb.log
for r in 1 2; do
  timeout 150 python3 bench/driver.py --stages 11_main,11_hopper_backward,11_va,11_vb,11_vc --sweep bf16-headline,extra,dpub --dtypes bf16 --no-torch-baselines --csv $OUT/ab$r.csv > /tmp/driver$r.log 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_hopper_backward 11_va 11_vb 11_vc | grep -v "cuDNN" | sed 's/bwd_det [-0-9.]*//g' | tee $OUT/ratios$r.txt
done
timeout 90 python3 .deps/devscripts/kprof2.py $OUT 11_main,11_va,11_vb,11_vc > $OUT/spans.txt 2>&1; log "kprof2 rc $?"; grep "==" $OUT/spans.txt | grep -v causal; rm -f $OUT/trace.json
(cd $OUT && tar czf all.tgz *.csv && rm -f *.csv)
