#!/usr/bin/env bash
# Adds up the per-tool lines that common/sanitize.sh wrote for each stage (build/<stage>/
# sanitize-summary.txt), prints them again and one line that sums them; a stage that wrote none
# (its build or its run stopped early) counts as failed. Exit 1 when anything failed.
# usage: sum_sanitize.sh SECONDS_SO_FAR STAGE...
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=$1
shift
errors=0 runs=0 ok=0 skipped=0 failed="" tools=""
echo "== make sanitize: every stage and tool"
for stage in "$@"; do
    summary=$root/build/$stage/sanitize-summary.txt
    if [ ! -s "$summary" ]; then
        echo "sanitize: $stage: no result (its build or its run stopped early)"
        failed="$failed, $stage"
        continue
    fi
    # sanitize: <stage> <tool>: <result>, <N> errors, ...
    while read -r _ _ tool result count _; do
        tool=${tool%:} result=${result%,}
        runs=$((runs + 1))
        case " $tools " in *" $tool "*) ;; *) tools="$tools $tool" ;; esac
        case $count in '' | *[!0-9]*) ;; *) errors=$((errors + count)) ;; esac
        case $result in
            ok) ok=$((ok + 1)) ;;
            skipped) skipped=$((skipped + 1)) ;;
            *) failed="$failed, $stage $tool" ;;
        esac
    done <"$summary"
    cat "$summary"
done
read -r -a tool_list <<<"$tools"
echo "sanitize: $# stages x ${#tool_list[@]} tools, $errors errors ($runs runs: $ok ok, $skipped skipped${failed:+, failed: ${failed#, }}; $seconds s; log: build/sanitize.log)"
[ -z "$failed" ]
