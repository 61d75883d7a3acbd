#!/bin/bash
# early-lse, call 2: Nsight Compute stall lines at the headline, main (8287ecb's stage 11, fb5936d's kernel) and 11_va (LSE read before the wait for S^T).
S=$SECONDS
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv > $OUT/gpu.txt
make -C 11_hopper_backward -j16 all > /dev/null 2>&1; make -C 11_va -j16 all > /dev/null 2>&1; echo "built at $((SECONDS-S)) s"
prof() {  # stage label commit
  make -C $1 profile NCU_COUNT=1 KERNEL=flash_backward > $OUT/$2-profile.log 2>&1; echo "$2 profile rc $? at $((SECONDS-S)) s"
  P=$OUT/$2
  ncu -i build/$1/profile.ncu-rep --page source --csv --print-source sass > $P-source-sass.csv 2>/dev/null
  ncu -i build/$1/profile.ncu-rep --page details --csv > $P-details.csv 2>/dev/null
  ncu -i build/$1/profile.ncu-rep --page raw --csv --print-units base > $P-raw.csv 2>/dev/null
  python3 bench/experiments/summarize_ncu.py --stall-lines $P --commit $3 > $OUT/$2-stall-lines.txt 2>&1; echo "summary rc $?"
  rm -f $P-source-sass.csv $P-raw.csv $P-details.csv $P-profile.log
}
prof 11_hopper_backward d128-main 8287ecb
prof 11_va d128-early-lse early-lse-only
ls -la $OUT
