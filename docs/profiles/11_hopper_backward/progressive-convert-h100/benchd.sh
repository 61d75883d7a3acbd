#!/bin/bash
# make bench detached (setsid: survives the call; the device README says so), so that a run longer than one call
# finishes. usage: bash .deps/devscripts/benchd.sh start <commit> [poll_s]   then   bash .deps/devscripts/benchd.sh wait x [poll_s]
if [ "$1" = start ]; then
  bash .deps/devscripts/prebuild.sh
  rm -f /tmp/bench.done
  setsid bash -c "make bench PYTHON=python3 BENCH_COMMIT=$2 > /tmp/make-bench.log 2>&1; echo \$? > /tmp/bench.done" </dev/null >/dev/null 2>&1 &
  sleep 2
fi
deadline=$((SECONDS + ${3:-540}))
while [ ! -f /tmp/bench.done ] && [ $SECONDS -lt $deadline ]; do sleep 3; done
tail -n 2 /tmp/make-bench.log | cut -c1-300
if [ -f /tmp/bench.done ]; then
  echo "make bench rc $(cat /tmp/bench.done)"
  R=$(ls -td bench/results/*/ | head -1); echo "results: $R"
  mkdir -p $OUT/results && cp $R/{*.txt,*.csv,bench.log} $OUT/results/ && cp /tmp/make-bench.log $OUT/results/ && (cd $OUT/results && tar czf ../results.tgz .) && rm -rf $OUT/results
else
  echo "STILL RUNNING"
fi
