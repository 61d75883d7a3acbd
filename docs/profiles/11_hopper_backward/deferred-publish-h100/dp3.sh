#!/bin/bash
# deferred-publish, call 3 (main at fb5936d): the FP64 suite, make sanitize, then make bench detached (benchd.sh).
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader >> $OUT/timeline.txt
make -C 11_hopper_backward -j16 all > /tmp/build.log 2>&1; log "build rc $?"
timeout 200 make -C 11_hopper_backward test > $OUT/test.log 2>&1; log "test rc $?"; tail -4 $OUT/test.log
timeout 120 make -C 11_hopper_backward sanitize > $OUT/sanitize.log 2>&1; log "sanitize rc $?"; grep "^sanitize:" $OUT/sanitize.log | tee $OUT/sanitize-summary.txt
bash .deps/devscripts/benchd.sh start fb5936d $((560 - (SECONDS - S)))
log "poll ended"
