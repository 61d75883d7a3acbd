#!/bin/bash
# deferred-publish, call 7: Nsight Compute stall lines of the default backward kernel. Headline (D = 128): main before
# (433c391, as 11_main) and fb5936d (11_hopper_backward); 4x8x4096^2 D = 64: fb5936d (published at once) and 11_v64
# (fb5936d with LATE_PUBLISH at D = 64 too, the variant that measured 3-4% slower).
S=$SECONDS
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv > $OUT/gpu.txt
for s in 11_main 11_hopper_backward 11_v64; do make -C $s -j16 all > /dev/null 2>&1 & done; wait; echo "built at $((SECONDS-S)) s"
prof() {  # stage label commit [bench args]
  make -C $1 profile NCU_COUNT=1 KERNEL=flash_backward ${4:+BENCH_ARGS="$4"} > $OUT/$2-profile.log 2>&1; echo "$2 profile rc $? at $((SECONDS-S)) s"
  P=$OUT/$2
  ncu -i build/$1/profile.ncu-rep --page source --csv --print-source sass > $P-source-sass.csv 2>/dev/null
  ncu -i build/$1/profile.ncu-rep --page details --csv > $P-details.csv 2>/dev/null
  ncu -i build/$1/profile.ncu-rep --page raw --csv --print-units base > $P-raw.csv 2>/dev/null
  python3 bench/experiments/summarize_ncu.py --stall-lines $P --commit $3 > $OUT/$2-stall-lines.txt 2>&1; echo "summary rc $?"
  rm -f $P-source-sass.csv $P-raw.csv
}
prof 11_main d128-main 433c391
prof 11_hopper_backward d128-late fb5936d
prof 11_hopper_backward d64-at-once fb5936d "--shape 4,8,4096,4096,64,0"
prof 11_v64 d64-late fb5936d+late-d64 "--shape 4,8,4096,4096,64,0"
ls -la $OUT
