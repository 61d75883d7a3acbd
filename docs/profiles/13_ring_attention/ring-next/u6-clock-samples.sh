#!/bin/bash
# bench/clock_samples.py on a real GPU: nvidia-smi samples GPU 0 once a second, as
# bench/run_ring_bench.sh does, while PyTorch multiplies bf16 matrices for 12 s; then the summary.
nvidia-smi -L | tee $OUT/gpus.txt
nvidia-smi -i 0 --query-gpu="$(python3 bench/clock_samples.py --fields)" \
    --format=csv,noheader,nounits -lms 1000 > $OUT/clocks.csv 2>$OUT/sampler.err &
SAMPLER=$!
python3 - <<'PY'
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + 12
while time.time() < end:
    for _ in range(20):
        b = a @ a
    torch.cuda.synchronize()
PY
sleep 2
kill $SAMPLER; wait $SAMPLER 2>/dev/null
head -3 $OUT/clocks.csv; cat $OUT/sampler.err
python3 bench/clock_samples.py $OUT/clocks.csv | tee $OUT/summary.txt
