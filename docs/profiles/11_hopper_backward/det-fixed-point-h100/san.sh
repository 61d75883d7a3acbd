#!/bin/bash
S=$SECONDS
nvidia-smi --query-gpu=name,uuid --format=csv > $OUT/gpu.txt
make -C 11_hopper_backward -j16 all > /tmp/build.log 2>&1; echo "[$((SECONDS-S)) s] build rc $?" >> $OUT/timeline.txt
timeout 480 make -C 11_hopper_backward sanitize > $OUT/sanitize.log 2>&1; echo "[$((SECONDS-S)) s] sanitize rc $?" >> $OUT/timeline.txt
grep "^sanitize:" $OUT/sanitize.log > $OUT/sanitize-summary.txt
