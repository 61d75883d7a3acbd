#!/bin/bash
S=$SECONDS
nvidia-smi --query-gpu=name,uuid --format=csv > $OUT/gpu.txt
make -C 11_hopper_backward -j16 all > /tmp/build.log 2>&1; echo "[$((SECONDS-S)) s] build rc $?" >> $OUT/timeline.txt
timeout 300 make -C 11_hopper_backward test > /tmp/test.log 2>&1; echo "[$((SECONDS-S)) s] test rc $?" >> $OUT/timeline.txt; tail -4 /tmp/test.log > $OUT/tests.log
timeout 200 make -C 11_hopper_backward sanitize > /tmp/san.log 2>&1; echo "[$((SECONDS-S)) s] sanitize rc $?" >> $OUT/timeline.txt
grep "^sanitize:" /tmp/san.log > $OUT/sanitize-summary.txt
python3 .deps/devscripts/kprof.py /tmp 11_hopper_backward 2>&1 | grep -v "Warning\|warn_once" > $OUT/kernels.txt; echo "[$((SECONDS-S)) s] kprof rc $?" >> $OUT/timeline.txt
