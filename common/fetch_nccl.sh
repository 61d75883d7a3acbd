#!/usr/bin/env bash
# Prints a folder that holds NCCL, include/nccl.h and lib/libnccl.so.2, for the ring-attention
# stage (13_ring_attention/Makefile); the build fetches it the way it fetches Doctest and
# cuobjdump, and installs nothing system-wide. Where it looks, in order:
#   1. NCCL_HOME, when set (it must hold both files; nothing else is tried);
#   2. DEPS_DIR/nccl (.deps/nccl), fetched by an earlier run;
#   3. NVIDIA's wheel nvidia-nccl-cu13 of the pinned version, already installed in the
#      site-packages of python3 (PyTorch for CUDA 13.0 pins the same one): used in place, once
#      its libnccl.so.2 has the pinned sha256 (the one the wheel's RECORD lists);
#   4. the system's (libnccl-dev): /usr/include/nccl.h with libnccl.so.2 beside the system's
#      libraries;
#   5. the wheel downloaded from PyPI (pinned version and sha256, as fetch_cuobjdump.sh does),
#      unpacked, not installed, into DEPS_DIR/nccl. The wheel is 187 MiB, the library 208 MiB
#      (device code for sm_75 to sm_120 and debug information).
# Exit 0 and the folder on stdout (a line on stderr says where it came from when it was just
# fetched); otherwise exit 1 and one line on stdout: what is missing and the command that
# installs it.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/common/fetch_wheel.sh"
deps=${DEPS_DIR:-$root/.deps}/nccl
PACKAGE=nvidia-nccl-cu13
VERSION=2.28.9
WHEEL_SHA256=e4553a30f34195f3fa1da02a6da3d6337d28f2003943aa0a3d247bbc25fefc42
LIBRARY_SHA256=1c8618b866734cbdd5401715d6178be763ece283b7f808ecf86dedab211162c1
INSTALL="python3 -m pip install $PACKAGE==$VERSION, or sudo apt-get install libnccl-dev, or set NCCL_HOME to a folder with include/nccl.h and lib/libnccl.so.2"

holds_nccl() { [ -f "$1/include/nccl.h" ] && [ -f "$1/lib/libnccl.so.2" ]; }

if [ -n "${NCCL_HOME:-}" ]; then
    holds_nccl "$NCCL_HOME" && { echo "$NCCL_HOME"; exit 0; }
    echo "NCCL_HOME=$NCCL_HOME has no include/nccl.h and lib/libnccl.so.2: it must name such a folder (a wheel's nvidia/nccl, say), or leave it unset and the build fetches NCCL itself"
    exit 1
fi

holds_nccl "$deps/nvidia/nccl" && { echo "$deps/nvidia/nccl"; exit 0; }

# The pinned wheel installed in a Python's site-packages (nvidia/nccl is a namespace package:
# found through the distribution's metadata, not by import).
if command -v python3 >/dev/null; then
    installed=$(python3 - "$PACKAGE" "$VERSION" 2>/dev/null <<'EOF'
import sys
from importlib import metadata
try:
    dist = metadata.distribution(sys.argv[1])
except metadata.PackageNotFoundError:
    sys.exit(0)
if dist.version == sys.argv[2]:
    print(dist.locate_file("nvidia/nccl"))
EOF
)
    if [ -n "$installed" ] && holds_nccl "$installed" &&
        [ "$(sha256sum "$installed/lib/libnccl.so.2" | cut -d' ' -f1)" = "$LIBRARY_SHA256" ]; then
        echo "$installed"; exit 0
    fi
fi

# The system's NCCL: its header, and the library where the system's libraries are.
for lib in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib; do
    if [ -f /usr/include/nccl.h ] && [ -f "$lib/libnccl.so.2" ]; then
        mkdir -p "$deps/system/include" "$deps/system/lib" &&
            ln -sf /usr/include/nccl.h "$deps/system/include/nccl.h" &&
            ln -sf "$lib/libnccl.so.2" "$deps/system/lib/libnccl.so.2" &&
            { echo "$deps/system"; exit 0; }
    fi
done

mkdir -p "$deps" || { echo "cannot create $deps; install NCCL with: $INSTALL"; exit 1; }
work=$(mktemp -d "$deps/.fetch-XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
: >"$deps/fetch.log"
fetch_wheel "$PACKAGE" "$VERSION" "$WHEEL_SHA256" "$work" "$deps/fetch.log" NCCL || exit 1
holds_nccl "$work/unpacked/nvidia/nccl" ||
    { echo "$FETCHED_WHEEL holds no nvidia/nccl with include/nccl.h and lib/libnccl.so.2; install NCCL with: $INSTALL"; exit 1; }
# Into place with a rename, so that builds side by side never see half a library.
rm -rf "$deps/nvidia" && mv "$work/unpacked/nvidia" "$deps/nvidia" ||
    { echo "could not put NCCL into $deps; install it with: $INSTALL"; exit 1; }
echo "NCCL: fetched $FETCHED_WHEEL (pip download, sha256 checked; nothing installed) -> $deps/nvidia/nccl" >&2
echo "$deps/nvidia/nccl"
