#!/bin/bash
# Stamped timelines of stage 12's non-causal D = 128 forward with its 176-key tiles (12_persistent)
# and with the causal kernel's 128-key tiles (12_k128), at 4,096 and 8,192 tokens.
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
for n in 4096 8192; do
  for s in 12_persistent 12_k128; do
    TIMELINE_WARMUP=20 build/experiments/timeline_$s 1 32 $n $n 128 0 > $OUT/timeline_${s}_$n.csv 2> $OUT/timeline_${s}_$n.err
    echo "$s $n rc $? $(wc -l < $OUT/timeline_${s}_$n.csv) lines"
  done
done
