#!/usr/bin/env bash
# Builds the `smla` Python package for another interpreter than the build's own (the GPU host's
# Python 3.12 with NumPy 2, say) from that interpreter's headers: replays the build's compile and
# link commands of the _smla module with its include directories, into OUT/smla.
# Usage: scripts/python_module_for.sh BUILD_DIR INCLUDE_DIRS EXT_SUFFIX OUT
#   INCLUDE_DIRS: the target's sysconfig.get_paths()['include'], plus (colon-separated) the
#                 directory holding its multiarch pyconfig.h where that header includes one
#   EXT_SUFFIX:   the target's sysconfig.get_config_var('EXT_SUFFIX'),
#                 e.g. .cpython-312-x86_64-linux-gnu.so
# Then: PYTHONPATH=OUT python3 -c "import smla" on the target (LD_LIBRARY_PATH naming a
# scripts/device_bundle.sh lib folder where the target lacks gRPC and abseil).
set -euo pipefail
build=${1:?build dir} includes=${2:?include dirs} suffix=${3:?extension suffix} out=${4:?out dir}
cmake --build "$build" --target _smla > /dev/null
isystem=""
IFS=: read -ra dirs <<<"$includes"
for d in "${dirs[@]}"; do isystem+=" -isystem $(realpath "$d")"; done
mkdir -p "$out/obj" "$out/smla"
obj=$(realpath "$out/obj")
lib=$(realpath "$out/smla")
cd "$build"
ninja -t commands _smla | grep -E ' -c [^ ]*client/python/src/' |
  sed -E -e "s# -isystem /usr/include/python3\.[0-9]+#${isystem}#" \
    -e 's# -MD -MT [^ ]+ -MF [^ ]+##' \
    -e "s# -o client/python/CMakeFiles/_smla\.dir/src/# -o ${obj}/#" | bash -e
ninja -t commands _smla | grep -E ' -shared ' |
  sed -E -e "s# -o python/smla/_smla[^ ]+# -o ${lib}/_smla${suffix}#" \
    -e "s#client/python/CMakeFiles/_smla\.dir/src/#${obj}/#g" | bash -e
cp python/smla/*.py "$lib/"
echo "python_module_for: $lib/_smla${suffix}"
