#!/bin/bash
# Call 4: build, suite, A/B against main (two runs), kernel durations; then make bench started detached.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
for s in 11_main 11_hopper_backward; do make -C $s -j16 all > $OUT/build-$s.log 2>&1 & done; wait; log "builds done"
timeout 300 make -C 11_hopper_backward test > $OUT/test.log 2>&1; log "test rc $?"; tail -3 $OUT/test.log
grep -q "Status: SUCCESS" $OUT/test.log || { cd $OUT && tar czf all.tgz *; exit 1; }
for r in 1 2; do
  python3 bench/driver.py --stages 11_main,11_hopper_backward --sweep bf16-headline,extra --dtypes bf16 --csv $OUT/ab$r.csv > $OUT/driver$r.log 2>&1; log "driver $r rc $?"
  python3 .deps/devscripts/ab_ratios.py $OUT/ab$r.csv 11_hopper_backward | tee $OUT/ratios$r.txt
done
python3 .deps/devscripts/kprof.py $OUT 11_hopper_backward,11_main > $OUT/kernels.txt 2>&1; log "kprof rc $?"
python3 bench/experiments/det_accuracy.py --stage 11_hopper_backward > $OUT/acc.txt 2>&1; log "acc rc $?"
rm -f $OUT/trace.json
(cd $OUT && tar czf all.tgz * && find . -type f ! -name all.tgz ! -name timeline.txt ! -name 'ratios*.txt' ! -name 'kernels.txt' ! -name acc.txt -delete)
rm -rf 11_main
bash .deps/devscripts/benchd.sh start $BENCH_COMMIT 30 > $OUT/benchd-start.txt 2>&1
