#!/usr/bin/env bash
# Builds the unit and integration tests with AddressSanitizer + UndefinedBehaviorSanitizer in
# their own build directory and runs them through ctest; any sanitizer report fails the run.
# Usage: scripts/sanitize.sh [build-dir]   (SMLA_JOBS: parallel jobs; SMLA_CTEST_ARGS: extra
# ctest arguments, e.g. "-R Security")
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
build="${1:-build-san}"
jobs="${SMLA_JOBS:-$(nproc)}"
cmake --preset asan -B "$build"
cmake --build "$build" -j "$jobs"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=${root}/scripts/sanitize/lsan.supp:print_suppressions=0"
cd "$build"
# Sanitized steps run many times slower: one test at a time on small machines.
# shellcheck disable=SC2086
ctest --output-on-failure -j "$(( jobs > 2 ? jobs / 2 : 1 ))" --timeout 1800 \
  ${SMLA_CTEST_ARGS:-}
