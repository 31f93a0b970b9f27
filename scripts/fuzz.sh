#!/usr/bin/env bash
# Builds the libFuzzer targets with Debian's clang (-fsanitize=fuzzer,address,undefined on the
# targets, fuzzer-no-link coverage on the whole service) and runs them for a bounded time in
# all: the step target two thirds of it, the region-descriptor target the rest.
# Step seeds: serialized valid requests generated now, plus tests/fuzz/regressions. Fails on a
# crash, a sanitizer report or a timeout; the input is left in the build directory
# (crash-*, timeout-*): copy a step input into tests/fuzz/regressions as a regression test.
# Usage: scripts/fuzz.sh [seconds=60] [build-dir=build-fuzz]
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
seconds="${1:-60}"
build="${2:-build-fuzz}"
jobs="${SMLA_JOBS:-$(nproc)}"
if ! command -v clang++ >/dev/null 2>&1; then
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    clang
fi
cmake --preset fuzz -B "$build"
cmake --build "$build" -j "$jobs" --target smla_step_fuzzer smla_region_fuzzer \
  smla_fuzz_make_seeds
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=${root}/scripts/sanitize/lsan.supp:print_suppressions=0"
corpus="$build/fuzz-corpus"
mkdir -p "$corpus"
"$build/tests/fuzz/smla_fuzz_make_seeds" "$corpus"
cd "$build"
# -timeout: one input may not take longer than this (a hang is a bug too); -rss_limit_mb keeps
# a leak from filling the machine.
step_seconds=$((seconds * 2 / 3))
region_seconds=$((seconds - step_seconds))
./tests/fuzz/smla_step_fuzzer -max_total_time="$step_seconds" -timeout=30 -rss_limit_mb=4096 \
  -max_len=262144 -print_final_stats=1 fuzz-corpus "$root/tests/fuzz/regressions"
mkdir -p region-corpus
./tests/fuzz/smla_region_fuzzer -max_total_time="$region_seconds" -timeout=30 \
  -rss_limit_mb=4096 -max_len=4096 -print_final_stats=1 region-corpus
echo "fuzz: no crash in ${seconds} s"
