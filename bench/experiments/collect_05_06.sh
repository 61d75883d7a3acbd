#!/usr/bin/env bash
# Reproduces the evidence of chapters 05 and 06 on a machine with a GPU, from the repository
# root: builds both stages (and 05 with the swizzle off), runs their suites, times the 06
# tilings, benchmarks 05, 06 and the PyTorch baselines at the target shapes, and profiles with
# Nsight Compute. Writes everything under $OUT (default build/evidence).
#   bash bench/experiments/collect_05_06.sh [steps...]   steps: build sass test tune bench ncu sanitize
# Written before issue 15: 06's tuner is now bench/experiments/tune_06.cu (make -C bench/experiments
# tune_06) and the single-V-buffer knob PIPELINE_V_BUFFERS is gone, so the tune step and the
# 06_vbuffers1 builds need docs/profiles/06_pipelined/variant-one-v-buffer-and-tune.patch.
set -uo pipefail
OUT=${OUT:-build/evidence}
mkdir -p "$OUT"
STEPS=${*:-build sass test tune bench ncu sanitize}
SHAPES=(1,8,4096,8192,128 4,8,4096,4096,64 16,16,4096,4096,128,1)
has() { [[ " $STEPS " == *" $1 "* ]]; }

if has build; then
  mkdir -p build
  make -C 05_mma_swizzle -j8 all > "$OUT/build-05.log" 2>&1 &
  make -C 06_pipelined -j8 all > "$OUT/build-06.log" 2>&1 &
  make -C 06_pipelined -j8 all NVCC_EXTRA=-DPIPELINE_V_BUFFERS=1 BUILD="$PWD/build/06_vbuffers1" \
    STAGE=06_pipelined > "$OUT/build-06-vbuffers1.log" 2>&1 &
  make -C 05_mma_swizzle -j8 all NVCC_EXTRA=-DATTENTION_SWIZZLE=0 BUILD="$PWD/build/05_noswizzle" \
    STAGE=05_mma_swizzle > "$OUT/build-05-noswizzle.log" 2>&1 &
  nvcc -std=c++17 -O3 -arch=native -Icommon -DATTENTION_DTYPE_BF16 -DATTENTION_NO_LAUNCHER \
       -Xptxas -v 06_pipelined/tune.cu common/validate.cpp common/cuda_check.cpp \
       -o build/tune_06 > build/tune_06.log 2>&1 &
  wait
  tail -n 3 "$OUT"/build-*.log; ls build/*/test_* build/*/bench_* build/tune_06
  for s in 05_mma_swizzle 06_pipelined 05_noswizzle 06_vbuffers1; do
    grep -E "Compiling entry|spill|registers" build/$s/build.log > "$OUT/ptxas-$s.txt"; done
  grep -E "Compiling entry|spill|registers" build/tune_06.log > "$OUT/ptxas-tune_06.txt"
fi
if has sass; then
  for s in 05_mma_swizzle 06_pipelined 06_vbuffers1; do cuobjdump -sass build/$s/obj/attention.o > "$OUT/sass-$s.txt"; done
  cuobjdump -sass build/tune_06 > "$OUT/sass-tune_06.txt"
  grep -c -E "STL|LDL" "$OUT"/sass-*.txt
fi
if has test; then
  for d in 05_mma_swizzle:05_mma_swizzle 06_pipelined:06_pipelined 06_vbuffers1:06_pipelined; do
    dir=${d%%:*}; s=${d##*:}
    timeout 240 build/$dir/test_$s > "$OUT/test-$dir.log" 2>&1; echo "test $dir exit $?"
    tail -n 4 "$OUT/test-$dir.log"
  done
fi
if has tune; then timeout 120 build/tune_06 | tee "$OUT/tune_06.txt"; fi
if has bench; then
  args=(); for s in "${SHAPES[@]}"; do args+=(--shape "$s"); done
  [[ -f "$OUT/ceilings.csv" ]] || timeout 60 build/05_mma_swizzle/bench_05_mma_swizzle --ceilings \
    --ceilings-file "$OUT/ceilings.csv" > "$OUT/ceilings.log" 2>&1
  for d in 05_mma_swizzle:05_mma_swizzle 06_pipelined:06_pipelined 06_vbuffers1:06_pipelined; do
    dir=${d%%:*}; s=${d##*:}
    timeout 120 build/$dir/bench_$s "${args[@]}" --csv "$OUT/bench-$dir.csv" --ceilings-file "$OUT/ceilings.csv" > "$OUT/bench-$dir.log" 2>&1
    echo "bench $dir exit $?"; cat "$OUT/bench-$dir.csv"
  done
  # Stage 04 (FP32), where a build of it is present, for the 05-vs-04 comparison.
  [[ -x build/04_warp_shuffle/bench_04_warp_shuffle ]] && timeout 120 build/04_warp_shuffle/bench_04_warp_shuffle \
    "${args[@]}" --csv "$OUT/bench-04.csv" --ceilings-file "$OUT/ceilings.csv" > "$OUT/bench-04.log" 2>&1 && cat "$OUT/bench-04.csv"
  timeout 120 python3 bench/baselines.py "${args[@]}" --pass fwd --dtypes bf16 --backends flash,cudnn \
    --csv "$OUT/bench-torch.csv" --ceilings-file "$OUT/ceilings.csv" > "$OUT/bench-torch.log" 2>&1
  echo "baselines exit $?"; cat "$OUT/bench-torch.csv"
fi
if has ncu; then
  BANKS=l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,smsp__inst_executed_op_ldsm.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum
  for s in 05_noswizzle 05_mma_swizzle; do
    bin=build/$s/bench_05_mma_swizzle
    timeout 90 ncu --clock-control none --metrics $BANKS -k regex:flash -c 1 $bin --shape 1,8,4096,8192,128 --profile > "$OUT/ncu-banks-$s.txt" 2>&1
  done
  # Stall reasons (average warps stalled per issued instruction) and the pipes they compete for.
  STALLS='regex:^(smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio|sm__pipe_tensor_op_hmma_cycles_active\.avg\.pct_of_peak_sustained_active|smsp__issue_active\.avg\.pct_of_peak_sustained_active|smsp__inst_executed\.sum|smsp__warps_active\.avg\.per_cycle_active|gpu__time_duration\.sum)$'
  for d in 05_mma_swizzle:05_mma_swizzle 06_pipelined:06_pipelined 06_vbuffers1:06_pipelined; do
    dir=${d%%:*}; s=${d##*:}
    timeout 120 ncu --clock-control none --metrics "$STALLS" -k regex:flash -c 1 \
      build/$dir/bench_$s --shape 1,8,4096,8192,128 --profile > "$OUT/ncu-stalls-$dir.txt" 2>&1
  done
fi
if has sanitize; then
  timeout 150 make -C 05_mma_swizzle sanitize > "$OUT/sanitize-05_mma_swizzle.log" 2>&1; echo "sanitize 05 exit $?"
  timeout 150 make -C 06_pipelined sanitize > "$OUT/sanitize-06_pipelined.log" 2>&1; echo "sanitize 06 exit $?"
  timeout 150 make -C 06_pipelined sanitize BUILD="$PWD/build/06_vbuffers1" STAGE=06_pipelined \
    NVCC_EXTRA=-DPIPELINE_V_BUFFERS=1 > "$OUT/sanitize-06_vbuffers1.log" 2>&1; echo "sanitize 06 vbuffers1 exit $?"
  grep -E "ERROR SUMMARY" "$OUT"/sanitize-*.log
fi
