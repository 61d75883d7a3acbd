#!/usr/bin/env bash
# Sums the one-line summaries the suites wrote; a suite that wrote none (its build failed or
# it crashed) counts as one failure. Usage: sum_tests.sh SUITE...
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
passed=0 failed=0 skipped=0
for suite in "$@"; do
  summary="$root/build/$suite/test-summary.txt"
  if [[ -f $summary ]]; then
    read -r _ p _ f _ s _ < "$summary"
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    echo "  $(cat "$summary")"
  else
    echo "  $suite: did not run to the end (build failure or crash): counted as 1 failed"
    failed=$((failed + 1))
  fi
done
echo "tests: $passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
