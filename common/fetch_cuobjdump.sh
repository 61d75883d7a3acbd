#!/usr/bin/env bash
# Prints the path of a cuobjdump (the SASS disassembler) for common/check_sass.py: the one on
# PATH when nvdisasm, which it runs, is there too; else the one in .deps/cuobjdump/ (DEPS_DIR),
# fetched there on first use from NVIDIA's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels
# on PyPI (pinned versions and sha256; unpacked, not installed), the way the build fetches
# Doctest. Some toolkit packages leave both out; they need no GPU.
# Exit 0 and the path on stdout; otherwise exit 1 and one line: what is missing and the command
# that installs it.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/common/fetch_wheel.sh"
deps=${DEPS_DIR:-$root/.deps}/cuobjdump
VERSION=13.5.37
declare -A SHA256=(
    [nvidia-cuda-cuobjdump]=38780fee50863252a0b8926357faa91615ca1c8346490563f33a06100cd73f58
    [nvidia-cuda-nvdisasm]=d3fdbdd49fa53e2e4aacd3db8259d052bd2b049ececdcb69e92e083c6728e7ca
)
INSTALL="python3 -m pip install nvidia-cuda-cuobjdump==$VERSION nvidia-cuda-nvdisasm==$VERSION, or put a CUDA Toolkit's bin/ with both on PATH"

if command -v cuobjdump >/dev/null && command -v nvdisasm >/dev/null; then
    command -v cuobjdump; exit 0
fi
bin=$deps/nvidia/cu13/bin
if [ -x "$bin/cuobjdump" ] && [ -x "$bin/nvdisasm" ]; then echo "$bin/cuobjdump"; exit 0; fi

mkdir -p "$deps" || { echo "cannot create $deps; install them with: $INSTALL"; exit 1; }
work=$(mktemp -d "$deps/.fetch-XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
: >"$deps/fetch.log"
for package in "${!SHA256[@]}"; do
    fetch_wheel "$package" "$VERSION" "${SHA256[$package]}" "$work" "$deps/fetch.log" cuobjdump || exit 1
done
chmod +x "$work/unpacked/nvidia/cu13/bin/"* && rm -rf "$deps/nvidia" && mv "$work/unpacked/nvidia" "$deps/nvidia" ||
    { echo "could not put the tools into $deps; install cuobjdump with: $INSTALL"; exit 1; }
echo "$bin/cuobjdump"
