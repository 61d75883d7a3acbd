#!/usr/bin/env bash
# Every failure a newcomer can meet without a GPU gives one line that says what is missing and
# what to do, before anything is built; and Doctest's download path works. Run by .ci/run; needs
# no GPU, no Doctest and no network but the package registries (a machine with a GPU, ncu or
# compute-sanitizer passes too: those are hidden through NVIDIA_SMI, NCU, COMPUTE_SANITIZER).
set -uo pipefail
cd "$(dirname "$0")/.."

tmp=$(mktemp -d)
server=
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$tmp"' EXIT
failures=0
checks=0
mkdir -p "$tmp/bin"
printf '#!/bin/sh\necho "GPU 0: Fake GPU (UUID: GPU-0)"\n' >"$tmp/bin/nvidia-smi"
# A T4 (compute capability 7.5), as nvidia-smi -L and --query-gpu=compute_cap,name answer.
printf '#!/bin/sh\ncase "$*" in *compute_cap*) echo "7.5, Tesla T4";; *) echo "GPU 0: Tesla T4 (UUID: GPU-0)";; esac\n' >"$tmp/bin/nvidia-smi-t4"
chmod +x "$tmp/bin/nvidia-smi" "$tmp/bin/nvidia-smi-t4"
NO_GPU=(NVIDIA_SMI=false)
NO_DRIVER=(NVIDIA_SMI="$tmp/none/nvidia-smi")
FAKE_GPU=(NVIDIA_SMI="$tmp/bin/nvidia-smi")
FAKE_T4=(NVIDIA_SMI="$tmp/bin/nvidia-smi-t4")
# Doctest out of reach: not in the system's folder, no .deps yet, no package download.
NO_DOCTEST=(DEPS_DIR="$tmp/no-deps" DOCTEST_SYSTEM_INCLUDE="$tmp/none" DOCTEST_APT=0)
touch "$tmp/stamp"
sleep 1

# expect STATUS PATTERN COMMAND...: COMMAND exits with STATUS, prints exactly one line (stdout
# and stderr together, less make -C's own "Entering/Leaving directory") that matches PATTERN
# (grep -E), and writes nothing under build/ or .deps/.
expect() {
    local status=$1 pattern=$2
    shift 2
    local output got
    output=$("$@" 2>&1)
    got=$?
    output=$(grep -vE "^make(\[[0-9]+\])?: (Entering|Leaving) directory" <<<"$output")
    checks=$((checks + 1))
    local lines written
    lines=$(printf '%s\n' "$output" | grep -c .)
    written=$(find build .deps -newer "$tmp/stamp" 2>/dev/null | head -n 3)
    if [[ $got -ne $status || $lines -ne 1 ]] || ! grep -qE -- "$pattern" <<<"$output" || [[ -n $written ]]; then
        echo "FAIL: $*"
        echo "  expected status $status and one line matching: $pattern"
        echo "  got status $got, $lines line(s):"
        printf '%s\n' "$output" | head -n 20 | sed 's/^/    | /'
        [[ -z $written ]] || echo "  and it wrote: $written"
        failures=$((failures + 1))
    else
        echo "ok: $* -> $output" | cut -c1-220
    fi
}

gpu="needs an NVIDIA GPU and none is visible"
echo "-- no GPU"
expect 2 "make bench $gpu" make bench "${NO_GPU[@]}"
expect 2 "make bench $gpu" env "${NO_GPU[@]}" bash bench/run_bench.sh
expect 2 "make sanitize $gpu" make sanitize "${NO_GPU[@]}"
expect 2 "make profile $gpu" make profile STAGE=04 "${NO_GPU[@]}"
expect 2 "make bench $gpu" make -C 04_warp_shuffle bench "${NO_GPU[@]}"
expect 2 "make sanitize $gpu" make -C 05_mma_swizzle sanitize "${NO_GPU[@]}"
expect 2 "make profile $gpu" make -C 04_warp_shuffle profile "${NO_GPU[@]}"
# No driver at all: the line does not send the reader to an nvidia-smi that is not there.
expect 2 "make bench needs an NVIDIA GPU and none is visible \($tmp/none/nvidia-smi is not installed: this machine has no NVIDIA driver\)" \
    make bench "${NO_DRIVER[@]}"

echo "-- GPUs and ARCH older than compute capability 8.0"
old_arch="the course needs compute capability 8.0 or newer \(Ampere, Ada, Hopper.*on a T4 or V100, .*CUDA_VISIBLE_DEVICES= make test ARCH=\"sm_80 sm_90\""
expect 2 "make test: ARCH=sm_75 is too old: $old_arch" make test ARCH=sm_75
expect 2 "make test: ARCH=sm_70 is too old: $old_arch" make test ARCH=sm_70
expect 2 "make all: ARCH=sm_75 is too old: $old_arch" make -C 03_online_softmax ARCH="sm_80 sm_75"
expect 2 "make test builds for the visible GPU \(ARCH=native\), Tesla T4, of compute capability 7.5: too old, $old_arch" \
    make test "${FAKE_T4[@]}"
expect 2 "make bench builds for the visible GPU \(ARCH=native\), Tesla T4, of compute capability 7.5: too old, $old_arch" \
    make bench "${FAKE_T4[@]}"
expect 2 "make all builds for the visible GPU \(ARCH=native\), Tesla T4, of compute capability 7.5: too old, $old_arch" \
    make -C 04_warp_shuffle "${FAKE_T4[@]}"

echo "-- no compute-sanitizer, no ncu (with a GPU)"
expect 2 "make sanitize needs compute-sanitizer, and $tmp/none/compute-sanitizer is not an executable: install it with: sudo apt-get install cuda-sanitizer-" \
    make sanitize "${FAKE_GPU[@]}" COMPUTE_SANITIZER="$tmp/none/compute-sanitizer"
expect 2 "make sanitize needs compute-sanitizer, and $tmp/none/compute-sanitizer is not an executable: install it with: sudo apt-get install cuda-sanitizer-" \
    make -C 07_backward sanitize "${FAKE_GPU[@]}" COMPUTE_SANITIZER="$tmp/none/compute-sanitizer"
expect 2 "make profile needs ncu, and $tmp/none/ncu is not an executable: install it with: sudo apt-get install cuda-nsight-compute-" make profile STAGE=04 "${FAKE_GPU[@]}" NCU="$tmp/none/ncu"
expect 2 "make profile needs ncu, and $tmp/none/ncu is not an executable: install it with: sudo apt-get install cuda-nsight-compute-" make profile STAGE=4 "${FAKE_GPU[@]}" NCU="$tmp/none/ncu"
expect 2 "make profile needs ncu, and $tmp/none/ncu is not an executable: install it with: sudo apt-get install cuda-nsight-compute-" \
    make profile STAGE=04_warp_shuffle "${FAKE_GPU[@]}" NCU="$tmp/none/ncu"

echo "-- no CUDA Toolkit"
expect 2 "make test needs nvcc, and $tmp/none/nvcc is not an executable: install the CUDA Toolkit" \
    make test NVCC="$tmp/none/nvcc"
expect 2 "make all needs nvcc, and $tmp/none/nvcc is not an executable: install the CUDA Toolkit" \
    make -C 00_naive NVCC="$tmp/none/nvcc"

echo "-- bad arguments"
expect 2 "usage: make profile STAGE=04" make profile
expect 2 "usage: make profile STAGE=04" make profile STAGE=99
expect 2 "usage: make diff A=03 B=04.*both needed" make diff A=3
expect 2 "usage: make diff A=03 B=04.*no stage B=99" make diff A=3 B=99
expect 2 "usage: make diff A=03 B=04.*no stage A=x" make diff A=x B=04
checks=$((checks + 1))
diff_output=$(make diff A=3 B=4 2>&1)
if [[ $? -eq 0 ]] && grep -q "^+++ b/04_warp_shuffle/attention.cu" <<<"$diff_output"; then
    echo "ok: make diff A=3 B=4 -> the diff of 03_online_softmax and 04_warp_shuffle"
else
    echo "FAIL: make diff A=3 B=4 does not show 04_warp_shuffle/attention.cu against 03's"
    failures=$((failures + 1))
fi
expect 2 "PYTHON=$tmp/none/python3 is not an interpreter" make plots PYTHON="$tmp/none/python3"
sweeps="the sweeps are: $(awk '!/^#/ && NF && !seen[$1]++ { printf "%s%s", sep, $1; sep = " " }' bench/sweeps.txt) \("
expect 2 "make bench: no sweep named nonexistent in bench/sweeps.txt; $sweeps" make bench SWEEP=nonexistent
expect 2 "make bench: no sweep named nonexistent in bench/sweeps.txt; $sweeps" make bench SWEEP=smoke,nonexistent
expect 2 "make bench: no sweep named nonexistent in bench/sweeps.txt; $sweeps" make bench BENCH_SWEEPS=nonexistent
expect 2 "make bench: no sweep named nonexistent in bench/sweeps.txt; $sweeps" env BENCH_SWEEPS=nonexistent make bench
expect 2 "make bench: no sweep named nonexistent in bench/sweeps.txt; $sweeps" make -C 04_warp_shuffle bench SWEEP=nonexistent
there="has no results.csv; the results folders there are: bench/results/"
expect 2 "RESULTS=bench/results/my-gpu $there" make plots RESULTS=bench/results/my-gpu
expect 2 "RESULTS=bench/results/my-gpu $there" make docs RESULTS=bench/results/my-gpu
expect 2 "RESULTS=bench/results/my-gpu $there" make docs-check RESULTS=bench/results/my-gpu
expect 2 "RESULTS=bench/results/my-gpu $there" make notebook RESULTS=bench/results/my-gpu

echo "-- the Python environment cannot be written"
if python3 -c "import matplotlib, numpy" 2>/dev/null; then
    checks=$((checks + 1))
    echo "ok: (python3 has the figures' packages: make plots makes no .deps/venv here, not exercised)"
else
    touch "$tmp/deps-file"
    expect 2 "the Python environment goes into $tmp/deps-file/venv, and $tmp/deps-file is a file, not a folder: remove it" \
        make plots DEPS_DIR="$tmp/deps-file"
    if [[ $(id -u) -ne 0 ]]; then
        mkdir -p "$tmp/deps-read-only" && chmod a-w "$tmp/deps-read-only"
        expect 2 "the Python environment goes into $tmp/deps-read-only/venv, and $tmp/deps-read-only is not writable" \
            make plots DEPS_DIR="$tmp/deps-read-only"
    fi
fi

echo "-- make help, make docs, the notebook"
# make help: one line for every goal of the top-level Makefile (its .PHONY list).
checks=$((checks + 1))
help=$(make --no-print-directory help 2>&1)
missing=
for goal in $(make -qp help 2>/dev/null | sed -n 's/^\.PHONY: //p'); do
    grep -qE "(^|[ /])$goal( |$)" <<<"$help" || missing="$missing $goal"
done
if [[ -z $missing && $help == *"make help"* ]]; then
    echo "ok: make help -> $(grep -c . <<<"$help") lines, every goal of the Makefile"
else
    echo "FAIL: make help does not list:${missing:- (no output)}"
    failures=$((failures + 1))
fi
# make docs: one line, on a copy of the tree (it rewrites what is stale): nothing changed, then
# one block broken by hand and rewritten.
mkdir -p "$tmp/copy"
git ls-files -z | xargs -0 cp --parents -t "$tmp/copy" 2>/dev/null
sed -i '/^<!-- results:fp32-headline -->$/{n;s/.*/| stale |/}' "$tmp/copy/README.md"
python3 "$tmp/copy/bench/tables.py" >/dev/null 2>&1
expect 0 "^docs: nothing changed" make --no-print-directory -C "$tmp/copy" docs
sed -i '/^<!-- results:fp32-headline -->$/{n;s/.*/| stale |/}' "$tmp/copy/README.md"
expect 0 "^docs: updated 1 generated block\(s\) in README.md$" make --no-print-directory -C "$tmp/copy" docs
# The notebook: the README names make notebook, and the notebook's own instructions name only
# make commands (no bare jupyter, which a fresh clone does not have).
checks=$((checks + 1))
first_cell=$(python3 -c 'import json, sys; print("".join(json.load(open(sys.argv[1]))["cells"][0]["source"]))' docs/benchmarks.ipynb)
if grep -q '^make notebook ' README.md && grep -q '`make notebook`' <<<"$first_cell" &&
    ! grep -qE 'jupyter (lab|nbconvert)|-m jupyter' <<<"$first_cell"; then
    echo "ok: README.md names make notebook; the notebook's first cell names make notebook, no bare jupyter"
else
    echo "FAIL: README.md must name make notebook, and docs/benchmarks.ipynb's first cell make notebook and no bare jupyter command"
    failures=$((failures + 1))
fi

echo "-- Doctest out of reach"
install="install it with: sudo apt-get install doctest-dev"
expect 2 "Doctest is not installed and could not be fetched .*$install" make test "${NO_DOCTEST[@]}"
expect 2 "Doctest is not installed and could not be fetched .*$install" make "${NO_DOCTEST[@]}"
expect 2 "Doctest is not installed and could not be fetched .*$install" \
    make -C 03_online_softmax test "${NO_DOCTEST[@]}"
expect 2 "could not download Doctest from DOCTEST_URL=http://127.0.0.1:9/doctest.h .*$install" \
    make test "${NO_DOCTEST[@]}" DOCTEST_URL=http://127.0.0.1:9/doctest.h
expect 2 "DOCTEST_INCLUDE=$tmp/none has no doctest/doctest.h: it must name the folder that holds doctest/doctest.h" \
    make test DOCTEST_INCLUDE="$tmp/none"
# A relative DOCTEST_INCLUDE is taken from the repository root, in every suite and at the top.
mkdir -p "$tmp/include/doctest" && touch "$tmp/include/doctest/doctest.h"
relative=$(realpath --relative-to=. "$tmp/include")
expect 2 "DOCTEST_INCLUDE=$PWD/no/such/folder has no doctest/doctest.h" make -C 03_online_softmax test DOCTEST_INCLUDE=no/such/folder
printf 'print-%%:\n\t@echo $($*)\n' >"$tmp/print.mk"
for dir in . 03_online_softmax bench/cublas_bf16; do
    expect 0 "^$tmp/include$" make -s --no-print-directory -C "$dir" -f Makefile -f "$tmp/print.mk" print-DOCTEST_DIR DOCTEST_INCLUDE="$relative"
done

echo "-- Doctest fetched by the build"
# The package download (what a machine without Doctest does), into a scratch .deps.
checks=$((checks + 1))
header=
if [[ -f /usr/include/doctest/doctest.h ]]; then
    header=/usr/include/doctest/doctest.h
    echo "ok: (the system has Doctest; the package download is not exercised here)"
elif DOCTEST_APT=1 bash common/fetch_doctest.sh "$tmp/apt/doctest/include" "$tmp/apt/doctest/include" \
        2>"$tmp/apt.err" >"$tmp/apt.out" && [[ -f $tmp/apt/doctest/include/doctest/doctest.h ]]; then
    header=$tmp/apt/doctest/include/doctest/doctest.h
    echo "ok: apt-get download doctest-dev, unpacked -> $(grep -c . "$header") lines of doctest.h"
else
    echo "FAIL: fetching Doctest with apt-get download: $(cat "$tmp/apt.out" "$tmp/apt.err")"
    failures=$((failures + 1))
fi
if [[ -n $header ]]; then
    sha=$(sha256sum "$header" | cut -d' ' -f1)
    mkdir -p "$tmp/www" && cp "$header" "$tmp/www/doctest.h"
    # file:// and http://localhost, checked against the checksum given.
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    python3 -m http.server "$port" --bind 127.0.0.1 --directory "$tmp/www" >/dev/null 2>&1 &
    server=$!
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/doctest.h')" 2>/dev/null && break
        sleep 0.5
    done
    for url in "file://$tmp/www/doctest.h" "http://127.0.0.1:$port/doctest.h"; do
        checks=$((checks + 1))
        dest=$tmp/url-$checks/doctest/include
        if DOCTEST_URL=$url DOCTEST_SHA256=$sha bash common/fetch_doctest.sh "$dest" "$dest" 2>/dev/null &&
            cmp -s "$header" "$dest/doctest/doctest.h"; then
            echo "ok: DOCTEST_URL=$url -> the header, checksum checked"
        else
            echo "FAIL: DOCTEST_URL=$url did not give the header"
            failures=$((failures + 1))
        fi
    done
    expect 2 "has sha256 $sha, not the pinned 0{64} \(DOCTEST_SHA256\): refused" \
        make test "${NO_DOCTEST[@]}" DOCTEST_URL="http://127.0.0.1:$port/doctest.h" DOCTEST_SHA256="$(printf '0%.0s' {1..64})"
fi

echo "-- NCCL out of reach (13_ring_attention)"
# A wrong NCCL_HOME stops the ring's build in one line, before anything is built (Doctest is
# taken from the scratch header above, so that nothing is fetched either).
expect 2 "NCCL_HOME=$tmp/none has no include/nccl.h and lib/libnccl.so.2: .*RING_NCCL=0" \
    make -C 13_ring_attention NCCL_HOME="$tmp/none" DOCTEST_INCLUDE="$tmp/include"
# No NCCL anywhere and PyPI out of reach: the fetch says what to install (only where no NCCL is
# installed for python3 or the system, which the script would take first).
if ! python3 -c "from importlib import metadata; metadata.distribution('nvidia-nccl-cu13')" 2>/dev/null &&
    [[ ! -f /usr/include/nccl.h ]]; then
    expect 1 "could not download nvidia-nccl-cu13 .*install NCCL with: python3 -m pip install nvidia-nccl-cu13==" \
        env DEPS_DIR="$tmp/no-nccl" PIP_INDEX_URL=http://127.0.0.1:9/ PIP_RETRIES=0 PIP_TIMEOUT=2 bash common/fetch_nccl.sh
else
    checks=$((checks + 1))
    echo "ok: (NCCL is installed here; the failing download is not exercised)"
fi

echo "message checks: $((checks - failures)) passed, $failures failed"
[[ $failures -eq 0 ]]
