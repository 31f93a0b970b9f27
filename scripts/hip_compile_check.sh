#!/usr/bin/env bash
# The HIP compile check (docs/gpu.md, "One source, two vendors"): every kernel source compiles
# device-only for gfx950 with Debian's clang-22 (docs/gpu.md's command) and in its host pass, and
# the sources that must use the matrix cores still have v_mfma instructions in their assembly;
# the GPU backend's host code compiles against Debian's HIP headers. Each kernel's registers,
# LDS and scratch are printed from the code object's metadata, and a kernel of a scratch-free
# source (the attention variants) with any scratch fails the check. Nothing here runs on a GPU.
#
# Usage: scripts/hip_compile_check.sh [--allow-fail SOURCE]... [--require-mfma SOURCE]...
#                                     [--no-scratch SOURCE]... [--keep DIR] [SOURCE...]
#   SOURCE        files to check, relative to the repository root (default: kernels/src/gpu/*.cu,
#                 the HIP primitives self-test and the GPU backend's host sources); the .cuh they
#                 include are compiled through them
#   --allow-fail  a source known not to compile for HIP yet: its failure is reported, and
#                 does not fail the check (its passing is reported too, so the flag goes)
#   --require-mfma  one more source whose assembly must contain v_mfma
#   --no-scratch  one more source whose kernels must have no scratch (private segment 0 bytes,
#                 no dynamic stack)
#   --keep DIR    keep the assembly (.s) and compiler output there
# Environment: HIP_CLANG (default clang++-22), HIP_ARCH (default gfx950), CXX_HOST (default
# c++), HIP_DEVICE_LIBS (default Debian's /usr/lib/x86_64-linux-gnu/amdgcn/bitcode). Exit
# status: 0 when every source passed (or is allowed to fail), 1 otherwise, 77 (skipped) when
# clang-22, the HIP headers or the device libraries are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

clang="${HIP_CLANG:-clang++-22}"
arch="${HIP_ARCH:-gfx950}"
cxx_host="${CXX_HOST:-c++}"
keep=""
declare -A allow_fail=()
sources=()
# Sources whose assembly must contain matrix instructions: the attention kernels (instantiated
# in attend_variants.cu) and the primitives' self-test.
mfma_required=(kernels/src/gpu/attend_variants.cu tests/gpu/hip_primitives_check.hip)
# Sources whose kernels must not touch scratch memory: the attention kernels.
scratch_free=(kernels/src/gpu/attend_variants.cu)
while [ $# -gt 0 ]; do
  case "$1" in
    --allow-fail) allow_fail["$2"]=1; shift 2 ;;
    --require-mfma) mfma_required+=("$2"); shift 2 ;;
    --no-scratch) scratch_free+=("$2"); shift 2 ;;
    --keep) keep="$2"; shift 2 ;;
    -h | --help) sed -n '2,23p' "$0"; exit 0 ;;
    -*) echo "hip_compile_check: unknown argument '$1'" >&2; exit 2 ;;
    *) sources+=("$1"); shift ;;
  esac
done

if ! command -v "$clang" > /dev/null; then
  echo "hip_compile_check: skipped: $clang not found (apt-get install clang-22 libamdhip64-dev)"
  exit 77
fi
if [ ! -f /usr/include/hip/hip_runtime.h ]; then
  echo "hip_compile_check: skipped: no HIP headers in /usr/include/hip (apt-get install" \
       "libamdhip64-dev)"
  exit 77
fi

# ROCm's device libraries (threadIdx, blockIdx, barriers' fences, votes are calls into them).
# ROCm's clang links them into every kernel and inlines them; with -nogpulib alone each of
# those calls stays a call, which costs a dynamic stack and spills a ROCm build does not have.
# Debian's rocm-device-libs are older than gfx950, so gfx940's ISA-version constant stands in.
device_libs="${HIP_DEVICE_LIBS:-/usr/lib/x86_64-linux-gnu/amdgcn/bitcode}"
isa_lib="oclc_isa_version_${arch#gfx}"
[ -f "$device_libs/$isa_lib.bc" ] || isa_lib=oclc_isa_version_940
link_libs=()
for lib in hip ocml ockl oclc_daz_opt_off oclc_unsafe_math_off oclc_finite_only_off \
           oclc_correctly_rounded_sqrt_on oclc_wavefrontsize64_on "$isa_lib" \
           oclc_abi_version_500; do
  if [ ! -f "$device_libs/$lib.bc" ]; then
    echo "hip_compile_check: skipped: no $device_libs/$lib.bc (apt-get install rocm-device-libs)"
    exit 77
  fi
  link_libs+=(-Xclang -mlink-builtin-bitcode -Xclang "$device_libs/$lib.bc")
done

if [ ${#sources[@]} -eq 0 ]; then
  sources=(kernels/src/gpu/*.cu tests/gpu/hip_primitives_check.hip
           kernels/src/gpu/gpu_backend.cc kernels/src/gpu/attend_launch.cc
           kernels/src/common/backend_registry.cc)
fi
if [ -n "$keep" ]; then
  out="$keep"
  mkdir -p "$out"
else
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' EXIT
fi

# docs/gpu.md's command, plus the project's include paths, the HIP build's macro and -Werror
# (a warning in device code fails the check, as in the CUDA and HIP builds).
device_flags=(-x hip "--offload-arch=$arch" -nogpulib --cuda-device-only
              -D__AMDGCN_WAVEFRONT_SIZE=64 -O3 -S -std=c++20 -DSMLA_WITH_HIP
              -Wall -Wextra -Werror -Wno-unused-parameter -Ibase/include -Ikernels/include -Ikernels/src)
if command -v c++filt > /dev/null; then demangle=(c++filt); else demangle=(cat); fi
host_flags=(-std=c++20 -fsyntax-only -Wall -Wextra -Werror -Wno-unused-parameter
            -DSMLA_WITH_HIP -Ibase/include -Ikernels/include -Ikernels/src)

# One tab-separated line per kernel of an assembly file: VGPRs (architectural), AGPRs, static
# LDS bytes, private segment (scratch) bytes, dynamic stack, VGPR/SGPR spills, symbol.
resources() {
  awk '/^amdhsa\.kernels:/ { on = 1; next }
       on && /^amdhsa\./ { on = 0 }
       !on { next }
       /^  - / { sub(/^  - /, "    ") }
       $1 == ".agpr_count:" { agpr = $2 }
       $1 == ".group_segment_fixed_size:" { lds = $2 }
       $1 == ".name:" { name = $2 }
       $1 == ".private_segment_fixed_size:" { private = $2 }
       $1 == ".sgpr_spill_count:" { sspill = $2 }
       $1 == ".uses_dynamic_stack:" { dynamic = $2 }
       $1 == ".vgpr_count:" { vgpr = $2 }
       $1 == ".vgpr_spill_count:" { vspill = $2 }
       $1 == ".wavefront_size:" {
         printf "%d\t%d\t%d\t%d\t%s\t%d/%d\t%s\n", vgpr - agpr, agpr, lds, private, dynamic,
                vspill, sspill, name
         agpr = lds = private = sspill = vgpr = vspill = 0; dynamic = "false"; name = ""
       }' "$1"
}

rows=()
passed=0
failed=0
allowed=0
report() {  # status source detail
  printf 'hip_compile_check: %-5s %-45s %s\n' "$1" "$2" "$3"
}
first_error() {
  grep -m1 -E 'error:' "$1" | sed -E 's/^[^ ]*error: //' | cut -c1-110
}
fail() {  # source detail
  if [ -n "${allow_fail[$1]:-}" ]; then
    report FAIL "$1" "$2 (allowed: not ported to HIP yet)"
    allowed=$((allowed + 1))
  else
    report FAIL "$1" "$2"
    failed=$((failed + 1))
  fi
}
pass() {  # source detail
  if [ -n "${allow_fail[$1]:-}" ]; then
    report ok "$1" "$2 (passes now: drop its --allow-fail)"
  else
    report ok "$1" "$2"
  fi
  passed=$((passed + 1))
}

for src in "${sources[@]}"; do
  [ -f "$src" ] || { fail "$src" "no such file"; continue; }
  name="$(echo "$src" | tr '/' '_')"
  log="$out/$name.log"
  case "$src" in
    *.cc)
      if "$cxx_host" "${host_flags[@]}" "$src" > "$log" 2>&1; then
        pass "$src" "host code against the HIP headers ($cxx_host)"
      else
        fail "$src" "host code does not compile: $(first_error "$log")"
      fi
      continue ;;
  esac
  asm="$out/$name.s"
  # The kernel headers compiled through this source (the preprocessor's include trace).
  through="$("$clang" "${device_flags[@]/-S/-E}" -H "$src" -o /dev/null 2>&1 |
             sed -n -E 's|^\.+ (kernels/src/gpu/.*\.cuh)$|\1|p' | xargs -r -n1 basename |
             sort -u | paste -sd, - || true)"
  with=""
  [ -n "$through" ] && with=" (with $through)"
  if ! "$clang" "${device_flags[@]}" "${link_libs[@]}" "$src" -o "$asm" > "$log" 2>&1; then
    errors="$(grep -c 'error:' "$log" || true)"
    fail "$src" "does not compile for $arch$with: $errors errors, first: $(first_error "$log")"
    continue
  fi
  # The host pass of the same source: kernel launches and host code against the HIP headers.
  host_flags_hip=("${device_flags[@]/--cuda-device-only/--cuda-host-only}")
  if ! "$clang" "${host_flags_hip[@]/-S/-fsyntax-only}" "$src" > "$log.host" 2>&1; then
    fail "$src" "device code compiles, the host pass does not: $(first_error "$log.host")"
    continue
  fi
  mfma="$(grep -c -E '^\s*v_mfma' "$asm" || true)"
  warnings="$(grep -c 'warning:' "$log" || true)"
  # Per-kernel resources from the code object's metadata (amdhsa.kernels, the note that
  # llvm-readelf --notes shows): .vgpr_count counts the AGPRs too.
  resources "$asm" | "${demangle[@]}" > "$out/$name.kernels"
  kernels=0
  scratch_kernels=0
  while IFS=$'\t' read -r vgpr agpr lds private dynamic spills kernel; do
    kernels=$((kernels + 1))
    scratch="$private"
    if [ "$dynamic" = true ]; then scratch="$private+dyn"; fi
    if [ "$private" -gt 0 ] || [ "$dynamic" = true ]; then
      scratch_kernels=$((scratch_kernels + 1))
    fi
    kernel="$(sed -E 's/^void //; s/smla::kernels::gpu:://g; s/\(anonymous namespace\):://g;
                               s/\([^()]*\)$//' <<< "$kernel")"
    rows+=("$(printf '%4d %4d %6d %8s %6s  %s (%s)' "$vgpr" "$agpr" "$lds" "$scratch" \
              "$spills" "$kernel" "$(basename "$src")")")
  done < "$out/$name.kernels"
  detail="$mfma v_mfma, scratch in $scratch_kernels of $kernels kernels, $warnings warnings$with"
  needs_mfma=0
  for m in "${mfma_required[@]}"; do [ "$m" = "$src" ] && needs_mfma=1; done
  no_scratch=0
  for m in "${scratch_free[@]}"; do [ "$m" = "$src" ] && no_scratch=1; done
  if [ "$needs_mfma" -eq 1 ] && [ "$mfma" -eq 0 ]; then
    fail "$src" "compiles, but has no v_mfma instruction: lost its matrix cores ($detail)"
  elif [ "$no_scratch" -eq 1 ] && [ "$scratch_kernels" -gt 0 ]; then
    fail "$src" "compiles, but its kernels use scratch memory ($detail)"
  else
    pass "$src" "$detail"
  fi
done

# For the port: CUDA primitives that have no HIP function of the same name (information only;
# LoadMatrixX4* and MmaBf16 are the m16n8k16 fragments, which gfx950 replaces by MFMA's).
primitive_names() {
  grep -hoE '__device__ __forceinline__ [^(]*[ *&][A-Za-z0-9_]+\(' "$1" |
    sed -E 's/.*[ *&]([A-Za-z0-9_]+)\($/\1/' | sort -u
}
cuda_only="$(comm -23 <(primitive_names kernels/include/smla/kernels/gpu/primitives.h) \
                      <(primitive_names kernels/include/smla/kernels/gpu/primitives_hip.h) |
             paste -sd' ' -)"
echo "hip_compile_check: CUDA primitives without a HIP namesake: ${cuda_only:-none}"
if [ ${#rows[@]} -gt 0 ]; then
  echo "hip_compile_check: kernel resources ($arch; VGPR: architectural, LDS: static bytes, the"
  echo "hip_compile_check: dynamic shared memory comes at launch; scratch: private segment bytes,"
  echo "hip_compile_check: +dyn for a dynamic stack; spills: VGPR/SGPR)"
  printf 'hip_compile_check: %4s %4s %6s %8s %6s  %s\n' VGPR AGPR LDS scratch spills kernel
  for row in "${rows[@]}"; do echo "hip_compile_check: $row"; done
fi
echo "hip_compile_check: $passed passed, $failed failed, $allowed allowed to fail ($arch)"
[ "$failed" -eq 0 ]
