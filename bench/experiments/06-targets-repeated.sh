# How docs/profiles/06_pipelined/bench-targets-repeated.csv was made (one device call, commit ffc39ab,
# from the repository root; written as $OUT/06-targets-repeated.csv): 06, 07 (same
# forward kernel) and PyTorch flash at the three target shapes of chapter 06, three interleaved rounds.
# OUT: the output folder; .deps/commit: the commit written to the CSV.
set -o pipefail
make -C 06_pipelined -j8 all > /dev/null 2>&1 & make -C 07_backward -j8 all > /dev/null 2>&1 & wait
SH="--shape 1,8,4096,8192,128 --shape 4,8,4096,4096,64 --shape 16,16,4096,4096,128,1"
C=$OUT/06-targets-repeated.csv
for r in 1 2 3; do
  build/06_pipelined/bench_06_pipelined $SH --pass fwd --csv $C --commit $(cat .deps/commit) > /dev/null 2>&1
  build/07_backward/bench_07_backward $SH --pass fwd --csv $C --commit $(cat .deps/commit) > /dev/null 2>&1
  python3 bench/baselines.py $SH --pass fwd --dtypes bf16 --backends flash --csv $C --commit $(cat .deps/commit) > /dev/null 2>&1
  echo "round $r at $SECONDS s"
done
wc -l $C
