#!/usr/bin/env bash
# Installs every Debian/Ubuntu package the build and the tests need (Debian 12, Ubuntu 24.04).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates curl
  libabsl-dev libspdlog-dev libfmt-dev
  libprotobuf-dev protobuf-compiler
  libgrpc++-dev protobuf-compiler-grpc grpc-proto   # gRPC's CMake config; health.proto
  libcpp-httplib-dev libssl-dev
  nlohmann-json3-dev                                # smla-bench's JSON report
  openssl                                           # test certificates (security tests)
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-yaml                              # tests/deploy
  python3-dev pybind11-dev python3-numpy python3-pytest  # the Python client and its tests
  clang-format-14                                   # scripts/check_format.sh (pinned)
)

# The HIP compile check (scripts/hip_compile_check.sh, docs/gpu.md) needs clang-22, Debian's HIP
# headers and ROCm's device libraries (linked into the kernels as a ROCm build does), and the
# tidy check (scripts/tidy.sh, docs/checks.md) clang-tidy-22. Debian 12 has all four; elsewhere
# (the ROCm and CUDA images) they are not needed.
add_debian12_packages() {
  local id="" version=""
  if [ -r /etc/os-release ]; then
    id="$(. /etc/os-release && echo "${ID:-}")"
    version="$(. /etc/os-release && echo "${VERSION_ID:-}")"
  fi
  if [ "$id" = debian ] && [ "$version" = 12 ]; then
    packages+=(clang-22 libamdhip64-dev rocm-device-libs clang-tidy-22)
  fi
}
add_debian12_packages

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
  "${missing[@]}"
