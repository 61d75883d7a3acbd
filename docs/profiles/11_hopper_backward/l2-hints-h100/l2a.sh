#!/bin/bash
# l2-hints, call 1: 11_main = main (fb5936d kernel); 11_hopper_backward = K/V evict_first + Q/dO evict_last; 11_va = K/V only;
# 11_vb = both + dQ reduce-adds evict_last; 11_vc = Q/dO only.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader >> $OUT/timeline.txt
make -C 11_main -j16 all > /tmp/build-11_main.log 2>&1; for s in 11_hopper_backward 11_va 11_vb 11_vc; do make -C $s -j16 all > /tmp/build-$s.log 2>&1 & done; wait; log "builds done"; ls build/11_*/*.so | wc -l
timeout 40 python3 .deps/devscripts/pc_stress.py 11_hopper_backward > $OUT/stress.txt 2>&1; log "stress rc $?"; tail -1 $OUT/stress.txt
for r in 1 2; do
  timeout 150 python3 bench/driver.py --stages 11_main,11_hopper_backward,11_va,11_vb,11_vc --sweep bf16-headline,extra,dpub --dtypes bf16 --no-torch-baselines --csv $OUT/ab$r.csv > /tmp/driver$r.log 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_hopper_backward 11_va 11_vb 11_vc | grep -v "cuDNN" | sed 's/bwd_det [-0-9.]*//g' | tee $OUT/ratios$r.txt
done
timeout 60 python3 .deps/devscripts/kprof2.py $OUT 11_main,11_hopper_backward > $OUT/spans.txt 2>&1; log "kprof2 rc $?"; grep "==" $OUT/spans.txt | grep -v causal; rm -f $OUT/trace.json
(cd $OUT && tar czf all.tgz ab1.csv ab2.csv && rm -f ab1.csv ab2.csv)
