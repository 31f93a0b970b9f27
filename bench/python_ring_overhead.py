#!/usr/bin/env python3
"""What the Python client adds to a step-ring call at C=1, against the C++ client's own loop.

One sequence pre-filled to --context on one layer, one decode request (1 verify + drafts rows)
placed in a region in the packed layout, one ring on one stream: the same request goes through
the same ring alternately from a Python loop (smla.StepRing.call, and call + reading .out) and
from the C++ client's loop (StepRing::Call in C++, timed in C++; StepRing._time_cpp_calls), in
interleaved blocks so drift on the host hits both alike. Prints p50 / p90 per call of each and
the Python overhead at p50. Run on the server's host, against a server with --allow_shm:

    build/server/smla-server --listen 127.0.0.1:50051 --allow_shm --backend auto \\
        --model dsv4.1-flash:tp=4:kv=fp8_dsv4:page_rows=64:pool=8GiB &
    PYTHONPATH=build/python python3 bench/python_ring_overhead.py --server 127.0.0.1:50051 \\
        --layer 2 --context 2048

--json FILE writes the numbers. Nothing here is a pass/fail check.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

import smla


def bf16(rng, *shape):
    return smla.float32_to_bf16(rng.uniform(-1, 1, shape))


def span(rng, model, layer, seq, first, rows, drafts):
    """Valid inputs for `rows` rows at `first`: KV rows, queries, compressed entries, top-k."""
    info = model["layers"][layer]
    h, w = model["heads_per_rank"], model["qk_width"]
    kw = {"drafts": drafts}
    r = info["compression_ratio"]
    if r > 0:
        kw["compressed_rows"] = bf16(rng, (first + rows) // r - first // r, w)
    if info["topk"] > 0:
        # Compressed entries on SWA_TOPK layers, positions on TOPK layers.
        visible = lambda p: (p + 1) // r if r > 0 else p + 1  # noqa: E731
        k = max(1, min(info["topk"], visible(first)))
        topk = np.full((rows, k), -1, np.int32)
        for t in range(rows):
            n = min(k, visible(first + t))
            topk[t, :n] = rng.choice(visible(first + t), size=n, replace=False)
        kw["topk"] = topk
    return smla.Span(seq, first, bf16(rng, rows, w), bf16(rng, rows, h, w), **kw)


def percentiles(ns):
    a = np.asarray(ns, dtype=np.float64) / 1e3
    return {"p50_us": float(np.percentile(a, 50)), "p90_us": float(np.percentile(a, 90)),
            "calls": len(a)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True, help="HOST:PORT of a server with --allow_shm")
    p.add_argument("--token", default="")
    p.add_argument("--model", default="", help="profile (default: the first served)")
    p.add_argument("--layer", type=int, default=2)
    p.add_argument("--context", type=int, default=2048, help="positions pre-filled")
    p.add_argument("--rows", type=int, default=6, help="rows per decode request")
    p.add_argument("--drafts", type=int, default=5, help="of which drafts")
    p.add_argument("--output_format", default="bf16", choices=["bf16", "mxfp8"])
    p.add_argument("--calls", type=int, default=20000, help="measured calls per client")
    p.add_argument("--warmup", type=int, default=2000)
    p.add_argument("--blocks", type=int, default=20, help="interleaved blocks per client")
    p.add_argument("--spin_us", type=float, default=30, help="StepRing spin before sleeping")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()

    c = smla.Client(a.server, token=a.token)
    info = c.info()
    model = next(m for m in info["models"] if not a.model or m["profile"] == a.model)
    name = model["profile"]
    rng = np.random.default_rng(1)
    if model["has_sinks"]:
        c.set_sinks(name, rng.uniform(-1, 1, (len(model["layers"]), model["heads_per_rank"])))
    seq = c.create_sequence(name, f"ring-overhead-{os.getpid()}")
    try:
        for first in range(0, a.context, 512):
            n = min(512, a.context - first)
            c.step(smla.StepRequest(name, a.layer, [span(rng, model, a.layer, seq, first, n, 0)]))
        req = smla.StepRequest(name, a.layer,
                               [span(rng, model, a.layer, seq, a.context, a.rows, a.drafts)],
                               output_format=a.output_format)
        slots, slot_bytes = 8, 64 << 10
        step_bytes = (req.bytes_for() + 4095) // 4096 * 4096
        region = smla.Region(c, f"ring-overhead-{os.getpid()}",
                             step_bytes + smla.StepRing.bytes_for(slots, slot_bytes))
        req.place(region, 0, layout="packed")
        stream = c.open_stream()
        ring = smla.StepRing(stream, region, step_bytes, slots, slot_bytes)
        ring.set_spin(a.spin_us)

        ring._time_cpp_calls(req, a.warmup)
        for _ in range(a.warmup):
            ring.call(req)
        per_block = max(1, a.calls // a.blocks)
        cpp, py_call, py_out = [], [], []
        clock = time.perf_counter_ns
        for _ in range(a.blocks):
            cpp += ring._time_cpp_calls(req, per_block)
            for _ in range(per_block // 2):
                t0 = clock()
                ring.call(req)
                py_call.append(clock() - t0)
            for _ in range(per_block - per_block // 2):
                t0 = clock()
                ring.call(req).out
                py_out.append(clock() - t0)
        del ring
        stream.writes_done()
        stream.finish()
    finally:
        c.release(seq)

    result = {
        "server": a.server, "device": info.get("device"), "model": name, "layer": a.layer,
        "context": a.context, "rows": a.rows, "output_format": a.output_format,
        "spin_us": a.spin_us, "cpp": percentiles(cpp), "python_call": percentiles(py_call),
        "python_call_and_out": percentiles(py_out),
    }
    result["python_overhead_p50_us"] = (result["python_call_and_out"]["p50_us"] -
                                        result["cpp"]["p50_us"])
    dev = info.get("device") or {}
    print(f"{name} layer {a.layer}, context {a.context}, {a.rows} rows, {a.output_format}, "
          f"ring spin {a.spin_us} us, backend {dev.get('backend', '?')} {dev.get('name', '')}")
    for key, label in [("cpp", "C++ StepRing::Call"), ("python_call", "Python ring.call"),
                       ("python_call_and_out", "Python ring.call + .out")]:
        r = result[key]
        print(f"  {label:26s} p50 {r['p50_us']:8.1f} us   p90 {r['p90_us']:8.1f} us   "
              f"({r['calls']} calls)")
    print(f"  Python overhead at p50: {result['python_overhead_p50_us']:+.1f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
