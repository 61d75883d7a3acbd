#!/bin/bash
# make bench's BF16 headline and extra sweeps twice back to back on one machine: main's stage 12, then with the lazy
# rescale (variant-lazy-rescale.patch) applied; each run's results into $OUT/ab.tgz.
S=$SECONDS
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
bash .deps/devscripts/prebuild.sh > /dev/null 2>&1; echo "[$((SECONDS-S)) s] prebuilt"
run() {
  BENCH_DTYPES=bf16 make bench SWEEP=bf16-headline,extra PYTHON=python3 BENCH_COMMIT=$2 > $OUT/$1.log 2>&1
  echo "[$((SECONDS-S)) s] $1 rc $?"
  mkdir -p $OUT/$1 && cp bench/results/nvidia-h100-80gb-hbm3/{results.csv,system.txt,aa-check.txt,bench.log} $OUT/$1/
}
run main 43ff35c
patch -p1 < docs/profiles/12_persistent/lazy-rescale-h100/variant-lazy-rescale.patch > /dev/null && echo patched
run lazy eecda8f
cd $OUT && tar czf ab.tgz main lazy && rm -rf main lazy
