#!/usr/bin/env bash
# The data-path benchmark of docs/results/bench-h200.md on one GPU machine: smla-bench against
# smla-server (CUDA backend) on the cell dsv4.1-flash fp8_dsv4 TP4 decode C=N 128K, layer 20,
# MXFP8 output with inverse RoPE, for each transport, with one device-bundle (NEW) and, when
# given, another (BASE: the code before the change) in the same run, so that the two are
# compared on one machine.
# Knobs: NEW and BASE (bundle folders holding bin/ and lib/ from scripts/device_bundle.sh;
# BASE empty to skip), CELLS (default "1 32 64"), TRANSPORTS (default "ring shm inline";
# "inline_mxq" is inline with MXFP8 queries, new bundles only; "gpu" and "gpu_ring" put the
# tensors and outputs in a GPU region of the bench's), BASE_TRANSPORTS (default
# TRANSPORTS without inline_mxq), DURATION_S (4), POOL (as in scripts/h200_ab.sh), OUT (where the
# JSON reports and the log go),
# ARG_SETS (gRPC channel-argument sets to compare on inline C=32 at a 4K context, where the
# transport dominates: "name=ARG,ARG ..." each, the same arguments on server and client;
# "default=" for none; empty to skip), SINGLE_COPY (non-empty: run NEW once more on the inline
# transports with --copy_threads=0 on the server and the bench, every copy on one thread), TRACE
# (the path of libsmla-launch-trace.so: NEW's server runs under it and writes the device
# operations of its last cell to OUT/trace-new.csv, for scripts/launch_trace.py).
set -euo pipefail
new=${NEW:?set NEW to the bundle to measure}
base=${BASE:-}
out=${OUT:-bench-out}
mkdir -p "$out"
cells=${CELLS:-1 32 64}
transports=${TRANSPORTS:-ring shm inline}
base_transports=${BASE_TRANSPORTS:-${transports//inline_mxq/}}
duration=${DURATION_S:-4}
port=50051

server_extra=()
bench_extra=()

start_server() {  # label bundle [server flags...]
  local label=$1 bundle=$2
  shift 2
  export LD_LIBRARY_PATH="$bundle/lib"
  local trace=()
  [ -n "${TRACE:-}" ] && [ "$label" = new ] &&
    trace=(env SMLA_TRACE_OUT="$out/trace-new.csv" SMLA_TRACE_LAST=6000 LD_PRELOAD="$TRACE")
  ${trace[@]+"${trace[@]}"} "$bundle/bin/smla-server" --backend cuda --allow_shm --listen 127.0.0.1:$port \
    --metrics_listen "" --model "dsv4.1-flash:tp=4:kv=fp8_dsv4:page_rows=64:pool=${POOL:-100GiB}" \
    ${server_extra[@]+"${server_extra[@]}"} "$@" \
    >"$out/server-$label.log" 2>&1 &
  server=$!
  for _ in $(seq 120); do
    "$bundle/bin/smla" --server 127.0.0.1:$port health >/dev/null 2>&1 && break
    sleep 1
  done
}

run_bundle() {  # label bundle transports
  local label=$1 bundle=$2 list=$3
  start_server "$label" "$bundle"
  for c in $cells; do
    for t in $list; do
      local args=(--transport "$t")
      [ "$t" = inline_mxq ] && args=(--transport inline --q_format mxfp8)
      case $t in ring | gpu_ring) args+=(--ring_spin_us 2000) ;; esac
      echo "$(date -u +%T) $label: C=$c $t"
      "$bundle/bin/smla-bench" --server 127.0.0.1:$port \
        --cell "dsv4.1-flash fp8_dsv4 TP4 decode C=$c 128K" --layer 20 \
        --output mxfp8 --inverse_rope --mode stream --concurrency 1 --sweep_min_gain -1 \
        --warmup_s 2 --duration_s "$duration" --prefill_chunk 16384 "${args[@]}" \
        ${bench_extra[@]+"${bench_extra[@]}"} \
        --json "$out/$label-c$c-$t.json" | grep -E "e2e|kernel|call|overhead" | head -n 12 || true
    done
  done
  kill -INT "$server"  # a clean exit, so that a tracer writes its file
  wait "$server" || true
}

run_args() {  # one channel-argument set: name=ARGS
  local name=${1%%=*} args=${1#*=}
  local flag=()
  [ -n "$args" ] && flag=(--grpc_arg "$args")
  start_server "args-$name" "$new" ${flag[@]+"${flag[@]}"}
  echo "$(date -u +%T) channel arguments $name: ${args:-none}"
  "$new/bin/smla-bench" --server 127.0.0.1:$port \
    --cell "dsv4.1-flash fp8_dsv4 TP4 decode C=32 128K" --context 4096 --layer 20 \
    --output mxfp8 --inverse_rope --mode stream --concurrency 1 --sweep_min_gain -1 \
    --warmup_s 2 --duration_s "$duration" --prefill_chunk 4096 --transport inline \
    ${flag[@]+"${flag[@]}"} --json "$out/args-$name.json" | grep -E "e2e|overhead" | head -n 4 || true
  kill "$server"
  wait "$server" || true
}

run_bundle new "$new" "$transports"
if [ -n "${SINGLE_COPY:-}" ]; then
  server_extra=(--copy_threads=0)
  bench_extra=(--copy_threads=0)
  run_bundle new-single-copy "$new" "inline inline_mxq"
  server_extra=()
  bench_extra=()
fi
[ -n "$base" ] && run_bundle base "$base" "$base_transports"
for set in ${ARG_SETS:-}; do run_args "$set"; done
echo "$(date -u +%T) datapath bench: done"
