#!/usr/bin/env bash
# Builds the service, starts smla-server on loopback (GPU backend when one is present, else the
# CPU backend), runs `smla info`, `smla health` and `smla demo` against it, and, when the Python
# package is built (pybind11 present), `import smla` and a health call from Python; then stops
# the server with SIGTERM (a graceful drain). Exit status is the demo's.
# Usage: scripts/demo.sh [build-dir]   (SMLA_SERVER_ARGS adds server flags)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
jobs="${SMLA_JOBS:-$(nproc)}"
cmake --preset service -B "$build"
cmake --build "$build" -j "$jobs" --target smla-server smla
# The Python package exists when CMake found pybind11 (it then lays out $build/python/smla).
python=""
if [ -f "$build/python/smla/__init__.py" ]; then
  cmake --build "$build" -j "$jobs" --target _smla
  python="$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")"
  python="${python:-python3}"
fi

log="$(mktemp -t smla-server.XXXXXX.log)"
# shellcheck disable=SC2086
"$build/server/smla-server" --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 \
  --backend auto ${SMLA_SERVER_ARGS:-} >"$log" 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null || true' EXIT

addr=""
for _ in $(seq 1 600); do
  addr="$(sed -n 's/.*listening on \([0-9.]*:[0-9]*\).*/\1/p' "$log" | head -n1)"
  [ -n "$addr" ] && break
  if ! kill -0 "$server_pid" 2>/dev/null; then cat "$log"; exit 1; fi
  sleep 0.1
done
[ -n "$addr" ] || { echo "demo: server did not start"; cat "$log"; exit 1; }
head -n1 "$log"

"$build/client/smla" --server "$addr" info
"$build/client/smla" --server "$addr" health
status=0
"$build/client/smla" --server "$addr" demo || status=$?
if [ -n "$python" ]; then
  PYTHONPATH="$build/python" "$python" -c "import smla, sys
c = smla.Client(sys.argv[1])
print('python: smla', smla.__version__, 'at', sys.argv[1], 'health', c.health())" "$addr" ||
    status=$?
  echo "demo: Python package in $build/python (export PYTHONPATH=\$PWD/$build/python)"
fi

kill -TERM "$server_pid"
wait "$server_pid" && echo "demo: server drained and exited 0" || echo "demo: server exit $?"
trap - EXIT
exit "$status"
