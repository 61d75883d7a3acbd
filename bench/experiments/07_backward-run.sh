#!/usr/bin/env bash
# How the 07_backward evidence files were produced on the device (one call of the run tool):
# build with the ptxas report, the full test suite, the dQ-strategy timing, the shared benchmark
# and the PyTorch baselines at the target shapes, Nsight Compute on the backward kernels, and
# compute-sanitizer. Usage, from the repository root: bash bench/experiments/07_backward-run.sh OUTDIR [steps...]
# Written at commit 0fec98d: 07_backward/time_dq_strategies.cu and the ATTENTION_BWD_WARPS and
# ATTENTION_FUSE_DQ knobs of its dq and variants steps are gone since (restored by
# docs/profiles/07_backward/variant-dq-second-kernel-and-knobs.patch).
set -o pipefail
OUTDIR=${1:?output folder}; shift
STEPS=${*:-build test dq bench torch ncu sanitize}
mkdir -p "$OUTDIR"
B=build/07_backward
SHAPES="--shape 1,8,4096,8192,128 --shape 4,8,4096,4096,64 --shape 1,8,4096,8192,128,1 --shape 4,8,4096,4096,64,1"
step() { [[ " $STEPS " == *" $1 "* ]]; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; nvcc --version | tail -1; } > "$OUTDIR/device.txt" 2>&1
if step build; then
  make -C 07_backward -j16 all 2>&1 | tail -20 > "$OUTDIR/build.txt"
  cp $B/build.log "$OUTDIR/07_backward-ptxas.txt"
  O=$B/obj
  nvcc -std=c++17 -O3 -arch=native -Icommon 07_backward/time_dq_strategies.cu $O/attention.o \
    $O/harness.o $O/validate.o $O/cuda_check.o $O/workspace.o $O/reference.o \
    $O/reference_backward.o -lcublas -o $B/time_dq >> "$OUTDIR/build.txt" 2>&1
fi
step test && timeout ${TEST_TIMEOUT:-150} $B/test_07_backward 2>&1 | tail -150 > "$OUTDIR/07_backward-tests.txt"
if step variants; then  # compile-time variants of the backward, timed the same way
  for variant in 8warps:-DATTENTION_BWD_WARPS=8 unfused:-DATTENTION_FUSE_DQ=0; do
    name=${variant%%:*}; flag=${variant#*:}; W=build/07_$name
    make -C 07_backward BUILD=$PWD/$W NVCC_EXTRA=$flag -j16 $PWD/$W/obj/attention.o $PWD/$W/obj/harness.o \
      $PWD/$W/obj/validate.o $PWD/$W/obj/cuda_check.o $PWD/$W/obj/workspace.o > /dev/null 2>&1
    cp $W/build.log "$OUTDIR/07_backward-ptxas-$name.txt"
    nvcc -std=c++17 -O3 -arch=native -Icommon 07_backward/time_dq_strategies.cu $W/obj/attention.o $W/obj/harness.o \
      $W/obj/validate.o $W/obj/cuda_check.o $W/obj/workspace.o -lcublas -o $W/time_dq >> "$OUTDIR/build.txt" 2>&1
    timeout 60 $W/time_dq > "$OUTDIR/07_backward-dq-strategies-$name.txt" 2>&1
  done
fi
step dq && timeout 60 $B/time_dq 2>&1 | tee "$OUTDIR/07_backward-dq-strategies.txt"
step bench && timeout 60 $B/bench_07_backward $SHAPES --pass all --csv "$OUTDIR/07_backward-bench.csv" 2>&1 | tail -30 > "$OUTDIR/07_backward-bench.txt"
step torch && timeout 90 python3 bench/baselines.py $SHAPES --pass bwd --dtypes bf16 --backends flash,cudnn --csv "$OUTDIR/07_backward-torch.csv" 2>&1 | tail -30 > "$OUTDIR/07_backward-torch.txt"
if step ncu; then
  timeout 120 ncu --set full --clock-control none --import-source yes -k regex:"dkdv|dq_kernel|preprocess|key_|convert" -c 4 -f -o "$OUTDIR/ncu" \
    $B/bench_07_backward --shape 1,8,4096,8192,128 --pass bwd --profile > "$OUTDIR/ncu-run.txt" 2>&1
  ncu -i "$OUTDIR/ncu.ncu-rep" --page details > "$OUTDIR/07_backward-ncu.txt" 2>&1
  rm -f "$OUTDIR/ncu.ncu-rep"
fi
step sanitize && timeout ${SANITIZE_TIMEOUT:-120} make -C 07_backward sanitize 2>&1 | grep -v "^\[doctest\] run with\|^\[doctest\] doctest version" | tail -60 > "$OUTDIR/07_backward-sanitize.txt"
exit 0
