#!/usr/bin/env bash
# Sourced by bench/run_bench.sh and bench/run_ring_bench.sh: the lines of a run's system.txt
# that say what machine the numbers belong to.
#
# system_lines PYTHON
#   every GPU as nvidia-smi lists it, the CUDA driver, nvcc, PyTorch (with its CUDA and cuDNN,
#   through PYTHON) and the host.
system_lines() {
    local python=$1
    echo "nvidia-smi:"
    nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit,persistence_mode \
        --format=csv 2>/dev/null | sed 's/^/  /' || echo "  (nvidia-smi not available)"
    echo "cuda driver: $(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' || echo unknown)"
    echo "nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*, V[0-9.]*' || echo unknown)"
    echo "torch: $("$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>/dev/null || echo 'not importable')"
    echo "host: $(uname -srm), $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ //')"
}
