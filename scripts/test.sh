#!/usr/bin/env bash
# Builds everything with tests and runs the whole CPU suite through ctest.
# Usage: scripts/test.sh [build-dir]   (SMLA_CMAKE_ARGS adds configure options)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-test}"
jobs="${SMLA_JOBS:-$(nproc)}"
# shellcheck disable=SC2086
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSMLA_BUILD_TESTS=ON \
  -DSMLA_BUILD_BENCH=ON ${SMLA_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"
cd "$build"
ctest --output-on-failure -j "$jobs" --timeout 900
