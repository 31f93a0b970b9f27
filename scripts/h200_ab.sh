#!/usr/bin/env bash
# Two servers compared on one GPU machine, alternated (A B A B ...), with one client binary and
# fixed cores, so that a difference between them is not the machine's drift or the scheduler's
# placement (docs/results/bench-h200.md, "How to reproduce"). Cell dsv4.1-flash fp8_dsv4 TP4
# decode C=N 128K, layer 20, MXFP8 output with inverse RoPE, closed loop, one stream.
# Knobs: A and B (bundle folders holding bin/ and lib/ from scripts/device_bundle.sh; A's
# smla-bench and smla drive both), ROUNDS (2), CELLS ("32"), TRANSPORTS ("gpu_ring inline";
# as in scripts/h200_datapath.sh), DURATION_S (4), SERVER_CPUS ("0-7"), CLIENT_CPUS ("8-15"),
# A_FLAGS and B_FLAGS (extra server flags of each, e.g. the same bundle with and without one),
# POOL (the KV pool, "100GiB"; the cell's one layer at C=64 takes about 5 GB, so "48GiB" suits an
# H100),
# OUT (JSON reports named a1-c32-gpu_ring.json, b1-..., and the servers' logs).
set -euo pipefail
a=${A:?set A to a bundle}
b=${B:?set B to a bundle}
out=${OUT:-ab-out}
mkdir -p "$out"
port=50051
tool="$a/bin/smla"
bench="$a/bin/smla-bench"

run_server() {  # label bundle round flags
  local label=$1 bundle=$2 round=$3 flags=$4
  # shellcheck disable=SC2086 # the flags split into words
  LD_LIBRARY_PATH="$bundle/lib" taskset -c "${SERVER_CPUS:-0-7}" "$bundle/bin/smla-server" \
    --backend cuda --allow_shm --listen 127.0.0.1:$port --metrics_listen "" \
    --model "dsv4.1-flash:tp=4:kv=fp8_dsv4:page_rows=64:pool=${POOL:-100GiB}" $flags \
    >"$out/server-$label$round.log" 2>&1 &
  local server=$!
  for _ in $(seq 120); do
    LD_LIBRARY_PATH="$a/lib" "$tool" --server 127.0.0.1:$port health >/dev/null 2>&1 && break
    sleep 1
  done
  for c in ${CELLS:-32}; do
    for t in ${TRANSPORTS:-gpu_ring inline}; do
      local args=(--transport "$t")
      [ "$t" = inline_mxq ] && args=(--transport inline --q_format mxfp8)
      case $t in ring | gpu_ring) args+=(--ring_spin_us 2000) ;; esac
      echo "$(date -u +%T) $label$round: C=$c $t"
      LD_LIBRARY_PATH="$a/lib" taskset -c "${CLIENT_CPUS:-8-15}" "$bench" \
        --server 127.0.0.1:$port --cell "dsv4.1-flash fp8_dsv4 TP4 decode C=$c 128K" \
        --layer 20 --output mxfp8 --inverse_rope --mode stream --concurrency 1 \
        --sweep_min_gain -1 --warmup_s 2 --duration_s "${DURATION_S:-4}" --prefill_chunk 16384 \
        "${args[@]}" --json "$out/$label$round-c$c-$t.json" | grep -E "e2e|kernel|call" | head -n 6 || true
    done
  done
  kill -INT "$server"
  wait "$server" || true
}

for round in $(seq "${ROUNDS:-2}"); do
  run_server a "$a" "$round" "${A_FLAGS:-}"
  run_server b "$b" "$round" "${B_FLAGS:-}"
done
echo "$(date -u +%T) a/b bench: done"
