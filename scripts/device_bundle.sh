#!/usr/bin/env bash
# Packs binaries built here so that they run on a GPU machine that has the driver and CUDA but
# not this build's libraries (gRPC, protobuf, abseil, spdlog, ...): DIR/bin gets the binaries,
# DIR/lib every shared library they load, named by its SONAME, except the C and C++ runtimes
# and the CUDA driver, which the GPU machine brings in newer versions.
# Usage: scripts/device_bundle.sh DIR BINARY...
# Run there as: LD_LIBRARY_PATH=DIR/lib DIR/bin/NAME ...
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 DIR BINARY..." >&2; exit 2; }
dir=$1
shift
mkdir -p "$dir/bin" "$dir/lib"
for binary in "$@"; do
  cp -f "$binary" "$dir/bin/"
  while read -r lib; do
    base=$(basename "$lib")
    case "$base" in
      libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libgcc_s.so* | \
        libstdc++.so* | libcuda.so*) continue ;;
    esac
    soname=$(objdump -p "$lib" 2>/dev/null | awk '$1 == "SONAME" {print $2}')
    cp -fL "$lib" "$dir/lib/${soname:-$base}"
  done < <(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3}')
done
du -sh "$dir" | awk '{print "bundle: " $1}'
