#!/bin/bash
# The lazy rescale (12_lazy) beside main's stage 12 (12_main) with PyTorch's baselines in the turns, as make bench
# times them: the BF16 sweeps, one driver run.
S=$SECONDS
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
python3 bench/driver.py --stages 12_main,12_lazy,10_pingpong --sweep bf16-headline,extra,seqlen --dtypes bf16 \
  --csv $OUT/lz3.csv > $OUT/driver.log 2>&1; echo "[$((SECONDS-S)) s] driver rc $?"
