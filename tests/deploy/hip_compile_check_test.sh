#!/usr/bin/env bash
# ctest's run of scripts/hip_compile_check.sh: every kernel source against gfx950, the attention
# variants with MFMA instructions for both dots and a resource row each without scratch, then
# three sources made here that the check must reject: one that does not compile, one that lost
# its matrix instructions, one whose kernel spills to scratch. Exits 77 (ctest: skipped) when
# clang-22, the HIP headers or the device libraries are missing.
# Usage: hip_compile_check_test.sh SOURCE_DIR
set -uo pipefail
src_dir="$1"
check="$src_dir/scripts/hip_compile_check.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

all="$("$check" 2>&1)"
rc=$?
echo "$all"
[ "$rc" -eq 77 ] && exit 77
[ "$rc" -eq 0 ] || { echo "FAIL: the kernel sources do not pass the HIP compile check"; exit 1; }
# Both dots of each of the 10 attention variants are MFMA: far more than one per kernel.
mfma="$(sed -n -E 's|.*ok +kernels/src/gpu/attend_variants\.cu +([0-9]+) v_mfma.*|\1|p' <<< "$all")"
if [ -z "$mfma" ] || [ "$mfma" -lt 20 ]; then
  echo "FAIL: attend_variants.cu has ${mfma:-no} v_mfma instructions (expected at least 20)"
  exit 1
fi

# The resource table: a row per attention variant (12: 6 tile-kernel, 6 direct), none with scratch.
rows="$(grep -cE '^hip_compile_check: +[0-9]+ +[0-9]+ +[0-9]+ +0 +[0-9]+/[0-9]+  SparseMlaAttend' \
        <<< "$all" || true)"
if [ "$rows" -lt 12 ]; then
  echo "FAIL: $rows attention kernels without scratch in the resource table (expected 12)"
  exit 1
fi

cat > "$tmp/no_mfma.hip" <<'EOF'
#include "smla/kernels/gpu/primitives.h"
__global__ void Scale(float* x) { x[threadIdx.x] *= 2.0f; }
EOF
cat > "$tmp/broken.hip" <<'EOF'
#include "smla/kernels/gpu/primitives.h"
__global__ void Broken(float* x) { x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1); }
EOF
cat > "$tmp/spill.hip" <<'EOF'
#include "smla/kernels/gpu/primitives.h"
__global__ void Spill(float* x, int i) {
  float a[256];  // indexed at run time: lives in scratch
  for (int k = 0; k < 256; ++k) a[k] = x[k * blockDim.x + threadIdx.x];
  x[threadIdx.x] = a[i & 255];
}
EOF
failures=0
expect_reject() {  # source pattern [args...]
  local source="$1" pattern="$2"
  shift 2
  local out
  out="$("$check" "$@" "$source" 2>&1)"
  local code=$?
  echo "$out"
  if [ "$code" -ne 1 ] || ! grep -q -- "$pattern" <<< "$out"; then
    echo "FAIL: expected the check to reject $source with '$pattern' (exit $code)"
    failures=$((failures + 1))
  fi
}
expect_reject "$tmp/no_mfma.hip" "no v_mfma instruction" --require-mfma "$tmp/no_mfma.hip"
expect_reject "$tmp/broken.hip" "does not compile for gfx950"
expect_reject "$tmp/spill.hip" "use scratch memory" --no-scratch "$tmp/spill.hip"
[ "$failures" -eq 0 ] || exit 1
echo "hip_compile_check_test: OK"
