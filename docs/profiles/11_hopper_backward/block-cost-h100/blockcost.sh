#!/bin/bash
# The per-block cost of stage 11's backward: the block-cost sweep, a phase timeline of blocks 264-267
# (the third round at the headline), and every block's span at the headline and at 33 heads.
S=$SECONDS
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee $OUT/gpu.txt
make -C 11_hopper_backward -j16 all > /tmp/b.log 2>&1 || tail -20 /tmp/b.log
echo "[$((SECONDS-S)) s] built"
python3 bench/driver.py --stages 11_hopper_backward --sweep block-cost --dtypes bf16 --no-torch-baselines --csv $OUT/block-cost.csv > $OUT/driver.log 2>&1; echo "driver rc $?"
echo "[$((SECONDS-S)) s] driver"
TIMELINE_FIRST_BLOCK=264 build/experiments/timeline_11_hopper_backward > $OUT/timeline-264.csv 2>>$OUT/driver.log; echo "timeline rc $?"
build/experiments/timeline_spans_11_hopper_backward 1 8 4096 8192 128 0 0 > $OUT/spans-headline.csv 2>>$OUT/driver.log; echo "spans rc $?"
build/experiments/timeline_spans_11_hopper_backward 1 33 1024 8192 128 0 0 > $OUT/spans-h33-q1024.csv 2>>$OUT/driver.log; echo "spans33 rc $?"
echo "[$((SECONDS-S)) s] done"
