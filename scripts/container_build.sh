#!/usr/bin/env bash
# The build the container images run (Dockerfile, deploy/cuda/Dockerfile), kept here so the
# Dockerfiles stay thin and CI runs the same steps where no container engine exists:
#   1. install the build dependencies (scripts/install_deps.sh),
#   2. configure (CMake preset "service") and build smla-server, smla and smla-bench for the
#      chosen GPU backend and architecture,
#   3. install them into PREFIX with the install rules (cmake/SmlaInstall.cmake): component
#      runtime (bin/, share/smla/server.textproto, the example config), then runtime_deps
#      (lib/: shared libraries from outside the distribution, e.g. ROCm's, copied, and
#      share/smla/runtime-packages.txt: the distribution packages that provide every other
#      shared library the binaries load; the runtime stage installs exactly these),
#   4. check the installed binaries start: --helpfull, and with --smoke a CPU-backend server
#      on loopback answering `smla health` (the image's HEALTHCHECK command).
#
# Usage: scripts/container_build.sh [--backend none|cuda|hip] [--arch ARCH] [--prefix DIR]
#          [--build-dir DIR] [--jobs N] [--skip-deps] [--install-only] [--smoke]
#   --arch          gfx950 (hip) or 90a (cuda); passed as CMAKE_{HIP,CUDA}_ARCHITECTURES
#   --install-only  steps 3-4 from an existing build directory (what the ctest check runs)
set -euo pipefail
cd "$(dirname "$0")/.."

backend=none
arch=""
prefix=/opt/smla
build="build-container"
jobs="$(nproc)"
skip_deps=0
install_only=0
smoke=0
while [ $# -gt 0 ]; do
  case "$1" in
    --backend) backend="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --prefix) prefix="$2"; shift 2 ;;
    --build-dir) build="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --skip-deps) skip_deps=1; shift ;;
    --install-only) install_only=1; shift ;;
    --smoke) smoke=1; shift ;;
    *) echo "container_build: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$backend" in none | cuda | hip) ;; *)
  echo "container_build: --backend must be none, cuda or hip" >&2; exit 2 ;;
esac
log() { echo "container_build: $*"; }

if [ "$install_only" -eq 0 ]; then
  [ "$skip_deps" -eq 1 ] || ./scripts/install_deps.sh
  cmake_args=(-DSMLA_BUILD_SERVICE=ON "-DSMLA_GPU_BACKEND=$backend")
  if [ "$backend" = hip ]; then
    [ -n "$arch" ] && cmake_args+=("-DCMAKE_HIP_ARCHITECTURES=$arch")
    rocm="${ROCM_PATH:-/opt/rocm}"
    [ -d "$rocm" ] && cmake_args+=("-DCMAKE_PREFIX_PATH=$rocm")
  elif [ "$backend" = cuda ] && [ -n "$arch" ]; then
    cmake_args+=("-DCMAKE_CUDA_ARCHITECTURES=$arch")
  fi
  log "configure --preset service ${cmake_args[*]}"
  cmake --preset service -B "$build" "${cmake_args[@]}"
  cmake --build "$build" -j "$jobs" --target smla-server smla smla-bench
fi

log "install into $prefix"
cmake --install "$build" --prefix "$prefix" --component runtime
cmake --install "$build" --prefix "$prefix" --component runtime_deps

export LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The binaries load (every shared library found) and know their flags; --helpfull exits 1.
for check in "smla-server:--listen" "smla:--server" "smla-bench:--server"; do
  help="$("$prefix/bin/${check%%:*}" --helpfull 2>&1 || true)"
  grep -q -- "${check#*:}" <<<"$help" || {
    echo "$help" | head -n 20 >&2
    echo "container_build: ${check%%:*} does not start" >&2
    exit 1
  }
done

if [ "$smoke" -eq 1 ]; then
  out="$(mktemp -d -t smla-smoke.XXXXXX)"
  "$prefix/bin/smla-server" --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 --backend cpu \
    --model "glm-5.3-flash:tp=8:page_rows=16:pool=16MiB" --cpu_threads 1 >"$out/log" 2>&1 &
  pid=$!
  trap 'kill "$pid" 2>/dev/null || true; rm -rf "$out"' EXIT
  addr=""
  for _ in $(seq 1 300); do
    addr="$(sed -n 's/.*listening on \([0-9.]*:[0-9]*\).*/\1/p' "$out/log" | head -n1)"
    [ -n "$addr" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$addr" ] || { cat "$out/log"; echo "container_build: server did not start" >&2; exit 1; }
  "$prefix/bin/smla" --server "$addr" --timeout_s 10 health
  kill -TERM "$pid"
  rc=0
  wait "$pid" || rc=$?
  [ "$rc" -eq 0 ] || { cat "$out/log"; echo "container_build: server exit $rc" >&2; exit 1; }
  log "smoke: server on $addr answered SERVING and drained on SIGTERM"
fi
log "done"
