#!/usr/bin/env bash
# Prints the Python interpreter that has the packages of bench/requirements.txt (the plots, the
# notebook), setting one up on first use. Run by make plots | notebook | diagrams | bench.
# usage: python_env.sh [plots|all]   (default all)
#   - PYTHON=/path/to/python: used as it is (nothing is installed);
#   - else python3, when it already imports every package;
#   - else the virtual environment .deps/venv (DEPS_DIR/venv), made once with
#     --system-site-packages, so that a system PyTorch stays visible to the baselines, and
#     filled with `pip install -r bench/requirements.txt`.
# Exit 0 and print the interpreter's path on stdout (progress on stderr); otherwise exit 1 and
# print on stdout one line: what is missing and the one command that installs it.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps=${DEPS_DIR:-$root/.deps}
requirements=$root/bench/requirements.txt
# The import names of bench/requirements.txt; with the argument `plots` (make bench, plots,
# diagrams) only those the figures need, so that a python3 with matplotlib and numpy will do.
if [ "${1:-all}" = plots ]; then
    CHECK="import matplotlib, numpy"
else
    CHECK="import matplotlib, numpy, nbformat, nbconvert, ipykernel"
fi

if [ -n "${PYTHON:-}" ]; then
    command -v "$PYTHON" >/dev/null || { echo "PYTHON=$PYTHON is not an interpreter on PATH"; exit 1; }
    if ! "$PYTHON" -c "$CHECK" 2>/dev/null; then
        echo "PYTHON=$PYTHON lacks packages of bench/requirements.txt; install them with: $PYTHON -m pip install -r bench/requirements.txt (or leave PYTHON unset and the build makes .deps/venv)"
        exit 1
    fi
    command -v "$PYTHON"; exit 0
fi
command -v python3 >/dev/null || { echo "python3 not found; install it with: sudo apt-get install python3 python3-venv"; exit 1; }
if python3 -c "$CHECK" 2>/dev/null; then command -v python3; exit 0; fi

venv=$deps/venv
stamp=$venv/.requirements.txt
if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$stamp" && "$venv/bin/python" -c "$CHECK" 2>/dev/null; then
    echo "$venv/bin/python"; exit 0
fi

# The environment lives in DEPS_DIR (.deps): say so when that cannot be written, not python3-venv.
shown=${deps#"$root"/}
if [ -e "$deps" ] && [ ! -d "$deps" ]; then
    echo "the Python environment goes into $shown/venv, and $shown is a file, not a folder: remove it (rm $shown; make makes it again), or install the packages yourself: python3 -m pip install -r bench/requirements.txt"
    exit 1
fi
if ! mkdir -p "$deps" 2>/dev/null || [ ! -w "$deps" ] || { [ -e "$venv" ] && [ ! -w "$venv" ]; }; then
    echo "the Python environment goes into $shown/venv, and $shown is not writable: make it writable (chmod -R u+w $shown) or name another folder with DEPS_DIR=, or install the packages yourself: python3 -m pip install -r bench/requirements.txt"
    exit 1
fi
log=$deps/venv.log
: >"$log"
if [ ! -x "$venv/bin/python" ]; then
    echo "making the Python environment ${venv#"$root"/} (once; it sees the system's packages, PyTorch included)" >&2
    if ! python3 -m venv --system-site-packages "$venv" >>"$log" 2>&1; then
        rm -rf "$venv"
        version=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
        echo "python3 cannot make a virtual environment (see ${log#"$root"/}); install it with: sudo apt-get install python3-venv (Debian/Ubuntu; or python$version-venv), or install the packages yourself: pip install -r bench/requirements.txt"
        exit 1
    fi
fi
echo "installing bench/requirements.txt into ${venv#"$root"/} (log: ${log#"$root"/})" >&2
if ! "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$requirements" >>"$log" 2>&1 ||
    ! "$venv/bin/python" -c "$CHECK" >>"$log" 2>&1; then
    echo "pip could not install bench/requirements.txt into ${venv#"$root"/} (see ${log#"$root"/}); check the network, or install them yourself: pip install -r bench/requirements.txt"
    exit 1
fi
cp "$requirements" "$stamp"
echo "$venv/bin/python"
