#!/usr/bin/env bash
# Builds a ping-pong stage's attention.cu as it was at a commit (with that commit's common/),
# optionally with a patch applied, for sm_90a with the stage's flags, and prints its ptxas report
# and what one consumer executes per K/V tile (bench/experiments/sass_tile_profile.py). No GPU
# needed. The stage is 12_persistent unless STAGE names another folder (10_pingpong: the
# commits before stage 12 existed, where the persistent kernel was stage 10 on its branch).
#
#   bench/experiments/persistent_sass.sh COMMIT [PATCH]     a commit's stage (and a patch on it)
#   bench/experiments/persistent_sass.sh WORKTREE           the stage of this working tree
#
# The evidence in docs/profiles/12_persistent/ was made with it:
#   persistent-sass-*.txt, as STAGE=10_pingpong (branch persistent-forward, before stage 12):
#     625e179                                                  the kernel the old persistent variant was made against
#     625e179 docs/profiles/10_pingpong/variant-persistent.patch   that variant, as it was timed
#     HEAD~N / WORKTREE                                        stage 10 before and with the branch's change
#   sass-tile-profile.txt: WORKTREE (stage 12 as committed) and, STAGE=10_pingpong, stage 10
set -euo pipefail
stage=${STAGE:-12_persistent}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cuobjdump=$(bash "$root/common/fetch_cuobjdump.sh") || { echo "$cuobjdump" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$1" = WORKTREE ]; then
    mkdir -p "$work/tree" && cp -r "$root/common" "$root/$stage" "$work/tree/"
else
    mkdir -p "$work/tree" && git -C "$root" archive "$1" common "$stage" | tar -x -C "$work/tree"
fi
if [ $# -ge 2 ]; then
    (cd "$work/tree" && git apply --include="$stage/*" --include='common/*' "$root/$2")
fi
cd "$work/tree"
nvcc -std=c++17 -O3 -lineinfo -Icommon -Xcompiler -fPIC -DATTENTION_STAGE_NAME="\"$stage\"" \
    -DATTENTION_DTYPE_BF16 -gencode arch=compute_90a,code=sm_90a -Xptxas -v \
    -c "$stage/attention.cu" -o attention.o > build.log 2>&1 || { cat build.log >&2; exit 1; }
echo "# $stage at ${1}${2:+ + $2}: $(nvcc --version | tail -n 1), sm_90a; $("$cuobjdump" --version | tail -n 1 | sed 's/^Build //') cuobjdump"
echo "## ptxas (-Xptxas -v), per kernel in the order compiled"
grep -E "Compiling entry|spill|Used" build.log | sed -E 's/.*(TilingILi[0-9ELi]+).*/\1/; s/^ptxas info *: //; s/^ +//'
echo "## per K/V tile (bench/experiments/sass_tile_profile.py)"
python3 "$root/bench/experiments/sass_tile_profile.py" attention.o --cuobjdump "$cuobjdump" --hgmma-gaps
