#!/bin/bash
# Lazy rescale on main: prebuild for make bench, stage 12's suite, sanitize of 12, sass-check (device build).
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
bash .deps/devscripts/prebuild.sh > $OUT/prebuild.log 2>&1; log "prebuild rc $?"
make -C 12_persistent test > $OUT/tests.log 2>&1; log "tests rc $?"
tail -3 $OUT/tests.log
make -C 12_persistent sanitize > $OUT/sanitize.log 2>&1; log "sanitize rc $?"
grep -h "^sanitize:" $OUT/sanitize.log
make sass-check > $OUT/sass-check.log 2>&1; log "sass-check rc $?"
tail -3 $OUT/sass-check.log
