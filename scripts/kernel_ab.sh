#!/usr/bin/env bash
# Kernel builds compared on one GPU machine in one call: smla-gpu-test of each build, then
# smla-kbench on the same cells in rounds that run every build in turn (so that a difference is
# not the machine's drift), compute-sanitizer on the warpgroup program's tests, and optionally
# the whole grid, all within a time budget so that the call ends with its logs and a summary
# rather than at the device's limit (docs/performance.md, "Kernel builds side by side").
# Usage: scripts/kernel_ab.sh BUILD...
#   Each BUILD is a folder holding smla-kbench and smla-gpu-test (a device bundle's bin/, or a
#   copy of another build's binaries beside it); LD_LIBRARY_PATH must reach their libraries.
#   The first build is the reference of the summary's percentages.
# Knobs: OUT (ab-out), BUDGET_S (540: a step that would not fit in what is left is skipped, and
#   steps.txt says so), ROUNDS (2), CELLS (smla-kbench --cell list; default the warpgroup
#   program's bar cells), TESTS (1; 0 skips smla-gpu-test), SANITIZE (builds to run racecheck and
#   memcheck on; default the first, empty for none), SANITIZE_FILTER (gtest filter; racecheck on
#   the row groups alone takes minutes), GRID (builds to run --grid with, in the order given,
#   about 45 s each on an H100; default none: with the first build and another, the summary
#   compares their whole grids, which catches what the bar cells miss),
#   KBENCH_FLAGS (extra flags of every timed run), SANITIZER (the compute-sanitizer binary).
# Writes OUT/steps.txt (each step's exit status and seconds), OUT/<step>.txt (its output),
# OUT/kbench-<build>-r<round>.json, OUT/grid-<build>.{json,md} and OUT/summary.md. Exits 1
# when a step failed or ran out of time (124), 0 when every step that ran passed.
set -uo pipefail  # not -e: a failed step is recorded and the others still run
[ $# -ge 1 ] || { echo "usage: $0 BUILD..." >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
builds=("$@")
out=${OUT:-ab-out}
mkdir -p "$out"
end=$((SECONDS + ${BUDGET_S:-540}))
reserve=5  # seconds kept for the summary
default_cells="dsv4-flash fp8_dsv4 TP1 decode C=16 128K,dsv4-flash fp8_dsv4 TP1 decode C=32 128K"
default_cells+=",dsv4-flash fp8_dsv4 TP1 decode C=64 128K,dsv4-flash fp8_dsv4 TP1 decode C=128 128K"
default_cells+=",dsv4-flash fp8_dsv4 TP1 prefill 8K 128K,dsv4-flash fp8_dsv4 TP2 decode C=64 128K"
default_cells+=",dsv4-flash fp8_dsv4 TP4 decode C=32 128K,dsv4-flash fp8_dsv4 TP4 prefill 8K 128K"
default_cells+=",dsv4-flash fp8_dsv4 TP8 prefill 8K 128K"
cells=${CELLS:-$default_cells}
sanitize=${SANITIZE-${builds[0]}}
filter=${SANITIZE_FILTER:-*WgmmaProgramMatchesCpu*:*WgmmaRowGroupsMatchCpu*}
sanitizer=${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
read -r -a kbench_flags <<< "${KBENCH_FLAGS:-}"
steps="$out/steps.txt"
: > "$steps"

left() { echo $((end - SECONDS)); }
label() { basename "$1"; }

# step NAME NEED COMMAND...: runs COMMAND (output in OUT/NAME.txt) under a timeout of what is
# left, when at least NEED seconds are.
step() {
  local name=$1 need=$2
  shift 2
  if [ "$(left)" -lt $((need + reserve)) ]; then
    echo "$name: skipped ($(left) s left, needs $need)" | tee -a "$steps"
    return
  fi
  local t0=$SECONDS
  timeout $(($(left) - reserve)) "$@" > "$out/$name.txt" 2>&1
  echo "$name: rc=$? ($((SECONDS - t0)) s)" | tee -a "$steps"
}

if [ "${TESTS:-1}" != 0 ]; then
  for b in "${builds[@]}"; do step "gpu-test-$(label "$b")" 30 "$b/smla-gpu-test"; done
fi
for r in $(seq "${ROUNDS:-2}"); do
  for b in "${builds[@]}"; do
    l=$(label "$b")
    step "kbench-$l-r$r" 15 "$b/smla-kbench" --cell="$cells" --nogemm --iters 20 \
      --json "$out/kbench-$l-r$r.json" ${kbench_flags[@]+"${kbench_flags[@]}"}
  done
done
for b in $sanitize; do
  for tool in racecheck memcheck; do
    step "$tool-$(label "$b")" 60 "$sanitizer" --tool "$tool" "$b/smla-gpu-test" \
      --gtest_filter="$filter"
  done
done
for g in ${GRID:-}; do
  l=$(label "$g")
  step "grid-$l" 60 "$g/smla-kbench" --grid --iters 20 --json "$out/grid-$l.json" \
    --md "$out/grid-$l.md"
done

labels=()
for b in "${builds[@]}"; do labels+=("$(label "$b")"); done
python3 "$here/kbench_compare.py" "$out" "${labels[@]}" | tee "$out/summary.md" || exit 1
! grep -q ": rc=[1-9]" "$steps"  # the exit status: 1 when a step failed or timed out
