#!/bin/bash
# Progressive conversion, call 9 (main at e364428, the merge): the kernels' spans per call beside 11_main (main before the merge), and the stress against it.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
git log --oneline -1 > $OUT/commit.txt
for s in 11_main 11_hopper_backward; do make -C $s -j16 all > $OUT/build-$s.log 2>&1 & done; wait; log "builds done"
timeout 60 python3 .deps/devscripts/pc_stress.py 11_hopper_backward > $OUT/stress.txt 2>&1; log "stress rc $?"; tail -1 $OUT/stress.txt
SHORT=1 timeout 90 python3 .deps/devscripts/kprof2.py $OUT 11_main,11_hopper_backward > $OUT/spans.txt 2>&1; log "kprof2 rc $?"; grep "==" $OUT/spans.txt
rm -f $OUT/trace.json
