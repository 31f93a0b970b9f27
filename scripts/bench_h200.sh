#!/usr/bin/env bash
# Issue 5, item 3: smla-server (CUDA backend) and smla-bench on one GPU machine for
# dsv4.1-flash fp8_dsv4 TP4, decode C=1,16,32,64 at 128K, shared memory and inline bytes, one
# and four streams. Writes docs/results/bench-h200-c<C>-<transport>.{json,html} (SMLA_OUT_DIR).
# Knobs: CELLS (the C values, in order, default "1 16 32 64"); TRANSPORTS (default
# "ring shm inline": shm is the packed shared-memory request, one region range per tensor kind
# for all spans, on the gRPC stream; ring the same request through the step ring; shm_spans the
# earlier per-span form); DURATION_S (10); PREFILL_CHUNK (16384 rows per pre-fill call);
# FOUR_STREAMS (cells that also run with four streams, default "32-shm"; empty for none);
# RING_SPIN_US (2000: how long a ring client's wait for its response spins before it sleeps on
# the futex; a frontend engine waits for its attention output on the critical path and would
# spin, so the bench does too instead of smla-bench's default of 30).
# Usage: scripts/bench_h200.sh [BUILD_DIR] (default build-gpu, configured with
# -DSMLA_GPU_BACKEND=cuda; the script builds smla-server and smla-bench there).
set -euo pipefail

# On a GPU machine without gRPC/abseil (the lent H200), build here and carry a device-bundle
# instead: SMLA_BIN_DIR=build-gpu/device/bin LD_LIBRARY_PATH=build-gpu/device/lib (the
# bundle's bin/ holds smla-server, smla and smla-bench side by side).
build=${1:-build-gpu}
out=${SMLA_OUT_DIR:-docs/results}
port=50051
if [ -n "${SMLA_BIN_DIR:-}" ]; then
  server_bin=$SMLA_BIN_DIR/smla-server smla_bin=$SMLA_BIN_DIR/smla bench_bin=$SMLA_BIN_DIR/smla-bench
else
  cmake --build "$build" --target smla-server smla-bench smla -j"$(nproc)"
  server_bin=$build/server/smla-server smla_bin=$build/client/smla
  bench_bin=$build/client/smla-bench
fi

"$server_bin" --backend cuda --allow_shm --listen 127.0.0.1:$port \
  --metrics_listen 127.0.0.1:9464 \
  --model dsv4.1-flash:tp=4:kv=fp8_dsv4:page_rows=64:pool=100GiB &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  "$smla_bin" --server 127.0.0.1:$port health >/dev/null 2>&1 && break
  sleep 1
done

# Layer 20 is a c1 layer (SWA 128 + top-512 of the 1/1 cache), the layer kbench times.
# Four streams (batching) run where FOUR_STREAMS names the cell: pre-filling 4 x C sequences of
# 128K is the long part of the run.
duration=${DURATION_S:-10}
for c in ${CELLS:-1 16 32 64}; do
  for t in ${TRANSPORTS:-ring shm inline}; do
    levels=1
    [[ " ${FOUR_STREAMS-32-shm} " == *" $c-$t "* ]] && levels=1,4
    ring_args=()
    [ "$t" = ring ] && ring_args=(--ring_spin_us "${RING_SPIN_US:-2000}")
    echo "$(date -u +%T) bench: C=$c $t, streams $levels"
    "$bench_bin" --server 127.0.0.1:$port \
      --cell "dsv4.1-flash fp8_dsv4 TP4 decode C=$c 128K" --layer 20 \
      --output mxfp8 --inverse_rope --transport "$t" --mode stream \
      --concurrency "$levels" --sweep_min_gain -1 --warmup_s 2 --duration_s "$duration" \
      --prefill_chunk "${PREFILL_CHUNK:-16384}" ${ring_args[@]+"${ring_args[@]}"} \
      --json "$out/bench-h200-c$c-$t.json" --html "$out/bench-h200-c$c-$t.html"
  done
done
echo "$(date -u +%T) bench: done"
