#!/usr/bin/env bash
# How the measurements quoted in chapters 02, 03 and 04 were taken (on one H100):
# the test suites, compute-sanitizer, the benchmark at the two shapes of the chapters (causal
# and not), and Nsight Compute on the headline shape B=8 H=12 N=4096 D=64.
#
#   bash bench/experiments/fp32_stages.sh [test] [sanitize] [bench] [profile] [variants]
#
# Everything lands in $OUT (default build/fp32_evidence): *.log, bench*.csv, and for each
# profiled stage (PROFILED, default 01-04) <stage>-ncu.txt (the Nsight Compute details page),
# <stage>-ncu-raw.csv (every metric collected) and <stage>-summary.txt (summarize_ncu.py).
# The chapters quote the copies in docs/profiles/<stage>/ (ncu-headline.txt, ncu-headline-summary.txt).
set -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/fp32_evidence}
mkdir -p "$OUT"
STAGES="02_tiled 03_online_softmax 04_warp_shuffle"
PROFILED=${PROFILED:-01_fused_rowwise $STAGES}
HEADLINE="8,12,4096,4096,64"
WIDE="1,32,4096,4096,128"
STEPS=${*:-test sanitize bench profile}
METRICS="l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
METRICS+=",l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
METRICS+=",l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
METRICS+=",smsp__sass_inst_executed_op_shared_ld.sum"
METRICS+=",smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"
METRICS+=",smsp__inst_executed.sum"
METRICS+=",l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
METRICS+=",l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"
METRICS+=",sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"
METRICS+=",lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum"
METRICS+=",sm__warps_active.avg.pct_of_peak_sustained_active"

# Kernels per forward call: the naive stage launches three.
launches_of() { [ "$1" = 00_naive ] && echo 3 || echo 1; }

kernel_of() {
    case $1 in
        00_naive) echo "(scores|softmax|pv)_kernel" ;;
        01_fused_rowwise) echo fused_rowwise_kernel ;;
        02_tiled) echo tiled_attention_kernel ;;
        03_online_softmax) echo online_softmax_attention_kernel ;;
        04_warp_shuffle) echo warp_shuffle_attention_kernel ;;
    esac
}

for stage in 01_fused_rowwise $STAGES; do make --no-print-directory -j16 -C "$stage" all & done
wait
for stage in 01_fused_rowwise $STAGES; do grep -E "registers|spill" "build/$stage/build.log" | sed "s/^/$stage: /"; done \
    | tee "$OUT/ptxas.log"

for step in $STEPS; do
    case $step in
    test)
        for stage in $STAGES; do
            (make --no-print-directory -C "$stage" test > "$OUT/test-$stage.log" 2>&1; \
             echo "$stage: exit $?" >> "$OUT/test-$stage.log") &
        done
        wait
        for stage in $STAGES; do grep -E "^suite|exit|FAILED|ERROR" "$OUT/test-$stage.log"; done
        ;;
    sanitize)
        for stage in $STAGES; do
            make --no-print-directory -C "$stage" sanitize > "$OUT/sanitize-$stage.log" 2>&1
            echo "$stage: make sanitize exit $?" | tee -a "$OUT/sanitize-$stage.log"
            grep -E "^==|ERROR SUMMARY" "$OUT/sanitize-$stage.log" | tee -a "$OUT/sanitize.log"
        done
        ;;
    bench)
        for stage in 01_fused_rowwise $STAGES; do
            "build/$stage/bench_$stage" --csv "$OUT/bench.csv" --shape "$HEADLINE" \
                --shape "$HEADLINE,1" --shape "$WIDE" --shape "$WIDE,1" 2>&1 | tee -a "$OUT/bench.log"
        done
        ;;
    variants)
        # Stage 04 built two other ways: 128 query rows and 256 threads per block (capped at
        # 128 registers), and without the shared-memory padding (profiled for bank conflicts).
        make --no-print-directory -j16 -C 04_warp_shuffle BUILD="$PWD/build/04_bq128" \
            NVCC_EXTRA="-DSTAGE04_BLOCK_Q=128 -DSTAGE04_MIN_BLOCKS=2" all > /dev/null &
        make --no-print-directory -j16 -C 04_warp_shuffle BUILD="$PWD/build/04_pad0" \
            NVCC_EXTRA="-DSTAGE04_PAD=0" all > /dev/null &
        wait
        for variant in 04_bq128 04_pad0; do
            grep -E "registers|spill" "build/$variant/build.log" | sed "s/^/$variant: /" \
                | tee -a "$OUT/ptxas.log"
            "build/$variant/bench_04_warp_shuffle" --csv "$OUT/bench-$variant.csv" \
                --shape "$HEADLINE" --shape "$WIDE" 2>&1 | tee -a "$OUT/bench.log"
        done
        ncu --clock-control none --metrics "$METRICS" -k regex:warp_shuffle -s 1 -c 1 \
            build/04_pad0/bench_04_warp_shuffle --shape "$HEADLINE" --profile \
            > "$OUT/04_pad0-ncu.txt" 2>&1
        ;;
    profile)
        sections="--section SpeedOfLight --section LaunchStats --section Occupancy"
        sections+=" --section WarpStateStats --section SchedulerStats"
        sections+=" --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables"
        sections+=" --section InstructionStats"
        for stage in $PROFILED; do
            # --profile runs the shape twice, untimed; -s 1 skips the first (cold) call.
            # shellcheck disable=SC2086
            ncu --clock-control none $sections --metrics "$METRICS" \
                -k "regex:$(kernel_of "$stage")" -s "$(launches_of "$stage")" -c "$(launches_of "$stage")" \
                -f -o "$OUT/$stage" \
                "build/$stage/bench_$stage" --shape "$HEADLINE" --profile > "$OUT/ncu-run-$stage.log" 2>&1
            ncu -i "$OUT/$stage.ncu-rep" --page details > "$OUT/$stage-ncu.txt" 2>&1
            ncu -i "$OUT/$stage.ncu-rep" --page raw --csv > "$OUT/$stage-ncu-raw.csv" 2>&1
            python3 bench/experiments/summarize_ncu.py "$OUT/$stage-ncu-raw.csv" > "$OUT/$stage-summary.txt"
            echo "$stage: $(wc -l < "$OUT/$stage-ncu.txt") lines of details"
        done
        ;;
    esac
done
