#!/usr/bin/env bash
# One stage's `make sanitize` (common/stage.mk): compute-sanitizer over the stage's test binary,
# one run per tool, every tool even when one fails. Each run's output goes to
# BUILD/sanitize-<tool>.log, and its result to one line, printed and appended to
# BUILD/sanitize-summary.txt (which common/sum_sanitize.sh adds up):
#   sanitize: <stage> <tool>: ok|FAILED|skipped, <N> errors, <cases run> cases, <seconds> s (<compute-sanitizer's summaries>)
# N counts compute-sanitizer's errors, racecheck's warnings included. A run fails when the tool
# reports an error, a case fails, or no case ran (Doctest counts the cases a filter leaves out
# as skipped, so "no case ran" on a usable GPU means the filter matched none); `skipped` (the
# suite says its GPU cases cannot run on this GPU) does not fail. Exit 1 when any run failed.
#
# usage: sanitize.sh STAGE TEST_BIN BUILD "TOOL|FLAGS|CASES" ...
#   CASES: a Doctest --test-case filter; COMPUTE_SANITIZER: the tool's path (default on PATH)
set -u
stage=$1 test_bin=$2 build=$3
shift 3
sanitizer=${COMPUTE_SANITIZER:-compute-sanitizer}
summary=$build/sanitize-summary.txt
rm -f "$summary"
failed=0
for run in "$@"; do
    IFS='|' read -r tool flags cases <<<"$run"
    log=$build/sanitize-$tool.log
    rm -f "$log.cases"
    start=$(date +%s)
    echo "== compute-sanitizer --tool $tool $flags: $stage ($cases)"
    # The suite writes its own one-line tally (passed, failed, skipped) to TEST_SUMMARY_FILE.
    # shellcheck disable=SC2086  # flags are words
    TEST_SUMMARY_FILE=$log.cases "$sanitizer" --tool "$tool" $flags --error-exitcode 1 \
        "$test_bin" --test-case="$cases" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    seconds=$(($(date +%s) - start))
    errors=$(awk '/^========= ERROR SUMMARY:/ { n = $4 }
                  /^========= RACECHECK SUMMARY:/ { gsub(/[(,]/, " "); n = $7 + $9 }
                  END { print n == "" ? "?" : n }' "$log")
    said=$(grep -E '^========= (ERROR|RACECHECK|LEAK) SUMMARY' "$log" | sed 's/^========= //' |
           paste -sd ';' - | sed 's/;/; /g')
    passed=x failures=x skips=x
    if [ -f "$log.cases" ]; then
        read -r passed failures skips < <(sed 's/.*: \([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) skipped/\1 \2 \3/' "$log.cases")
        rm -f "$log.cases"
    fi
    if [ "$passed" = x ]; then
        result=FAILED said="the test binary did not finish; $said"
    elif [ $status -eq 0 ] && [ "$errors" = 0 ] && [ "$passed" -eq 0 ] &&
         grep -q "^== $stage .*: GPU cases are skipped" "$log"; then
        result=skipped said="$(grep -m 1 "^== $stage " "$log" | sed 's/^== //'); $said"
    elif [ $status -ne 0 ] || [ "$errors" != 0 ] || [ "$failures" -ne 0 ] || [ "$passed" -eq 0 ]; then
        result=FAILED
    else
        result=ok
    fi
    if [ "$passed" != x ]; then
        [ "$failures" -ne 0 ] && said="$failures cases failed; $said"
        [ $result = FAILED ] && [ "$passed$failures" = 00 ] && said="no case ran under '$cases'; $said"
    fi
    [ $result = FAILED ] && failed=1
    echo "sanitize: $stage $tool: $result, $errors errors, ${passed/x/?} cases, $seconds s ($said)" | tee -a "$summary"
done
exit $failed
