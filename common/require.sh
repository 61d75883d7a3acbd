#!/usr/bin/env bash
# What a command needs before anything is built, checked in a fraction of a second:
#   common/require.sh gpu  "make bench"                  an NVIDIA GPU (NVIDIA_SMI -L lists one)
#   common/require.sh tool "make profile" ncu            a tool on PATH (or a path)
#   common/require.sh tool "make sanitize" compute-sanitizer
#   common/require.sh tool "make test" nvcc
#   common/require.sh arch "make test" "$(ARCH)"         ARCH (or the visible GPU, for native) of
#                                                        compute capability 8.0 or newer
# Prints nothing when it is there; otherwise one line on stdout: what is missing and what to do.
# The build (common/deps.mk) turns that line into its error. NVIDIA_SMI (default nvidia-smi)
# lets CI check the message on a machine that has a GPU (NVIDIA_SMI=false).
set -uo pipefail

what=${1:-}
command_name=${2:-this command}
case "$what" in
gpu)
    smi=${NVIDIA_SMI:-nvidia-smi}
    if ! "$smi" -L 2>/dev/null | grep -q "^GPU"; then
        if command -v "$smi" >/dev/null; then
            why="nvidia-smi lists none; check the driver with nvidia-smi"
        else
            why="$smi is not installed: this machine has no NVIDIA driver"
        fi
        echo "$command_name needs an NVIDIA GPU and none is visible ($why); without a GPU, make test still builds every stage and runs the host tests"
    fi
    ;;
arch)
    # ARCH as the build gets it (empty: common/arch.mk's default, native where a GPU is visible).
    arch=${3-}
    if [ -z "${arch// /}" ] && "${NVIDIA_SMI:-nvidia-smi}" -L 2>/dev/null | grep -q "^GPU"; then arch=native; fi
    needs="the course needs compute capability 8.0 or newer (Ampere, Ada, Hopper: ARCH=sm_80, sm_86, sm_89, sm_90; its BF16 stages use mma.sync on bf16, stages 08-11 sm_90a)"
    instead="on a T4 or V100, run the GPU parts on an Ampere or newer GPU (A100, A10G, L4, RTX 30 or 40 series, H100), or build everything and run the host tests with the GPU hidden: CUDA_VISIBLE_DEVICES= make test ARCH=\"sm_80 sm_90\""
    if [ "$arch" = native ]; then
        # The oldest visible GPU (drivers before 510 cannot say: then nothing is checked).
        oldest=$("${NVIDIA_SMI:-nvidia-smi}" --query-gpu=compute_cap,name --format=csv,noheader 2>/dev/null |
            grep -E '^[0-9]+\.[0-9]+,' | sort -t, -k1,1n | head -n 1)
        capability=${oldest%%,*}
        if [ -n "$oldest" ] && [ "${capability%%.*}" -lt 8 ]; then
            name=${oldest#*,}
            echo "$command_name builds for the visible GPU (ARCH=native), ${name# }, of compute capability $capability: too old, $needs; $instead"
        fi
    else
        for target in $arch; do
            number=$(sed -nE 's/^(sm|compute)_([0-9]+)[a-z]?$/\2/p' <<<"$target")
            if [ -n "$number" ] && [ "$number" -lt 80 ]; then
                echo "$command_name: ARCH=$target is too old: $needs; $instead"
                break
            fi
        done
    fi
    ;;
tool)
    tool=${3:?usage: require.sh tool COMMAND TOOL}
    command -v "$tool" >/dev/null && exit 0
    name=$(basename "$tool")
    if [[ $tool == */* ]]; then
        # Named by a path (NCU=, COMPUTE_SANITIZER=, NVCC=) that is not there.
        missing="$name, and $tool is not an executable"
    else
        missing="$name, which is not installed"
        for dir in /usr/local/cuda/bin /opt/nvidia/nsight-compute/*/; do
            if [ -x "${dir%/}/$name" ]; then
                echo "$command_name needs $name, which is in ${dir%/} but not on PATH: export PATH=${dir%/}:\$PATH"
                exit 0
            fi
        done
    fi
    # NVIDIA's apt packages are named after the toolkit's version: cuda-sanitizer-13-0.
    version=$(nvcc --version 2>/dev/null | grep -o 'release [0-9]*\.[0-9]*' | grep -o '[0-9.]*' | tr . -)
    if [ "$name" = nvcc ]; then
        echo "$command_name needs $missing: install the CUDA Toolkit (https://developer.nvidia.com/cuda-downloads; Debian/Ubuntu with NVIDIA's repository: sudo apt-get install cuda-toolkit) and put its bin/ on PATH"
        exit 0
    fi
    case "$name" in
    ncu) package=cuda-nsight-compute-${version:-<cuda version>} ;;
    compute-sanitizer) package=cuda-sanitizer-${version:-<cuda version>} ;;
    *) package=$name ;;
    esac
    echo "$command_name needs $missing: install it with: sudo apt-get install $package (from NVIDIA's CUDA repository; it comes with the full CUDA Toolkit)"
    ;;
*)
    echo "usage: common/require.sh gpu COMMAND | tool COMMAND TOOL | arch COMMAND ARCH" >&2
    exit 2
    ;;
esac
exit 0
