# Builds what make bench builds (bench/run_bench.sh's build step), so that the timed call finds it made.
set -e
PRINTER=/tmp/print.mk
printf 'print-%%:\n\t@echo $($*)\n' >"$PRINTER"
mv_() { make -s --no-print-directory -C "$1" -f Makefile -f "$PRINTER" "print-$2"; }
stages=$(mv_ . STAGES)
for s in $stages bench/cublas_fp32 bench/cublas_bf16; do make --no-print-directory -C $s -j16 common-bench-objects >/dev/null; done
for s in $stages bench/cublas_fp32 bench/cublas_bf16; do
  t=$(mv_ $s LIB); extra=""; [ $s = bench/cublas_bf16 ] && extra=$(mv_ $s BENCH_BIN)
  make --no-print-directory -C $s -j2 $t $extra >/tmp/prebuild-$(basename $s).log 2>&1 &
done
wait
echo prebuilt
