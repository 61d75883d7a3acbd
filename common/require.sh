#!/usr/bin/env bash
# What a command needs before anything is built, checked in a fraction of a second:
#   common/require.sh gpu  "make bench"                  an NVIDIA GPU (NVIDIA_SMI -L lists one)
#   common/require.sh tool "make profile" ncu            a tool on PATH (or a path)
#   common/require.sh tool "make sanitize" compute-sanitizer
#   common/require.sh tool "make test" nvcc
# Prints nothing when it is there; otherwise one line on stdout: what is missing and what to do.
# The build (common/deps.mk) turns that line into its error. NVIDIA_SMI (default nvidia-smi)
# lets CI check the message on a machine that has a GPU (NVIDIA_SMI=false).
set -uo pipefail

what=${1:-}
command_name=${2:-this command}
case "$what" in
gpu)
    if ! "${NVIDIA_SMI:-nvidia-smi}" -L 2>/dev/null | grep -q "^GPU"; then
        echo "$command_name needs an NVIDIA GPU and none is visible (nvidia-smi lists none; check the driver with nvidia-smi); without a GPU, make test still builds every stage and runs the host tests"
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
    echo "usage: common/require.sh gpu COMMAND | tool COMMAND TOOL" >&2
    exit 2
    ;;
esac
exit 0
