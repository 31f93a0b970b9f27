#!/usr/bin/env bash
# Builds everything with tests and runs the whole CPU suite through ctest.
# Usage: scripts/test.sh [build-dir]   (SMLA_CMAKE_ARGS adds configure options)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-test}"
jobs="${SMLA_JOBS:-$(nproc)}"
# shellcheck disable=SC2086
cmake --preset release -B "$build" ${SMLA_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"
cd "$build"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
ctest --output-on-failure -j "$jobs" --timeout 900 2>&1 | tee "$log" || status=$?
# ctest lists its skipped and disabled tests after the summary line; repeat the summary so that
# it is the last line printed.
grep -E '^[0-9]+% tests passed' "$log" | tail -n 1 || true
exit "$status"
