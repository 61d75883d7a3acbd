#!/usr/bin/env bash
# make diff A=03 B=04: what stage B's attention.cu changes in stage A's (without the chapters'
# excerpt markers; line numbers are those of the files without them). A and B may be numbers
# (3, 03) or folder names (03_online_softmax). Anything else: a usage line and exit status 2.
# With --check first, prints only that usage line (on stdout, nothing when A and B are stages):
# the Makefile checks before it runs anything.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
check=0
[[ ${1:-} == --check ]] && { check=1; shift; }

stages=$(ls -d [0-9][0-9]_*/ 2>/dev/null | tr -d / | tr '\n' ' ')
usage() {
    line="usage: make diff A=03 B=04 (two stages, by number or folder: ${stages% }): $1"
    if [[ $check == 1 ]]; then echo "$line"; exit 0; fi
    echo "$line" >&2
    exit 2
}
folder() {  # folder NAME: the stage folder NAME names, or nothing
    local name=${1%/}
    if [[ $name =~ ^[0-9]{1,2}$ ]]; then name=$(printf '%02d' "$((10#$name))"); fi
    for dir in "$name" "$name"_*; do
        [[ -f $dir/attention.cu && $dir =~ ^[0-9][0-9]_ ]] && { echo "$dir"; return; }
    done
}
[[ -n ${1:-} && -n ${2:-} ]] || usage "A and B are both needed"
a=$(folder "$1"); [[ -n $a ]] || usage "no stage A=$1"
b=$(folder "$2"); [[ -n $b ]] || usage "no stage B=$2"
[[ $check == 0 ]] || exit 0
# The chapters' excerpt markers (// excerpt: NAME, // end excerpt) are scaffolding for the docs,
# not code, and each stage has its own: they are left out, with changes of blank lines only.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for stage in "$a" "$b"; do
    mkdir -p "$work/$stage"
    grep -vE '^[[:space:]]*// (excerpt: [a-z0-9-]+|end excerpt)[[:space:]]*$' "$stage/attention.cu" >"$work/$stage/attention.cu"
done
(cd "$work" && git --no-pager diff --no-index --ignore-blank-lines --color=auto "$a/attention.cu" "$b/attention.cu")
status=$?
# git diff --no-index: 1 means the files differ, which is the point; anything above is an error.
[[ $status -le 1 ]] || exit "$status"
exit 0
