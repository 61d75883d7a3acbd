#!/bin/bash
# Fixed-point deterministic dQ, call 1: builds, suite, accuracy against FP64, two A/B driver runs.
S=$SECONDS
VARIANTS="11_hopper_backward" bash .deps/devscripts/ab3.sh
python3 bench/experiments/det_accuracy.py --stage 11_hopper_backward --csv $OUT/acc-fixed-point.csv > $OUT/acc-fixed-point.txt 2>&1
echo "[$((SECONDS-S)) s] accuracy rc $?" >> $OUT/timeline.txt
python3 bench/experiments/det_accuracy.py --stage 11_main > $OUT/acc-main.txt 2>&1
echo "[$((SECONDS-S)) s] accuracy main rc $?" >> $OUT/timeline.txt
cd $OUT && tar czf all.tgz * && find . -type f ! -name all.tgz ! -name timeline.txt ! -name 'ratios*.txt' ! -name 'acc-*.txt' -delete
