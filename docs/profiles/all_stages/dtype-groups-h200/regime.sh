#!/bin/bash
# Lazy rescale (12_persistent at 1f77927) against main's kernel (12_main, a0a0a06) inside make bench's schedule:
# the BF16 headline and extra sweeps, with the FP32 implementations in the turns (fp) and without (bf), twice.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
ST="00_naive 01_fused_rowwise 02_tiled 03_online_softmax 04_warp_shuffle 05_mma_swizzle 06_pipelined 07_backward 08_wgmma_tma 09_warp_specialized 10_pingpong 11_hopper_backward 12_persistent 12_main"
for s in $ST bench/cublas_fp32 bench/cublas_bf16; do make --no-print-directory -C $s -j16 common-bench-objects >/dev/null 2>&1; done
for s in $ST bench/cublas_fp32 bench/cublas_bf16; do make --no-print-directory -C $s -j4 >/dev/null 2>&1 & done; wait
log built
run() {
  BENCH_SWEEPS=bf16-headline,extra BENCH_DTYPES=$2 PYTHON=python3 BENCH_COMMIT=1f77927+12_main bash bench/run_bench.sh $ST > $OUT/$1.log 2>&1
  log "$1 rc $?"
  mkdir -p $OUT/r/$1 && cp bench/results/nvidia-h100-80gb-hbm3/{results.csv,bench.log,aa-check.txt} $OUT/r/$1/ && (cd $OUT && tar czf r.tgz r)
}
run fp1 fp32,bf16; run bf1 bf16; run fp2 fp32,bf16; run bf2 bf16
rm -rf $OUT/r
