#!/usr/bin/env python3
"""A remote attention backend for a vLLM- or SGLang-style frontend, over SMLA.

An engine calls its attention backend once per layer of each forward pass with the new tokens'
KV rows and queries (and, for DeepSeek-V4-style layers, its indexer's top-k choices and the
compressed-cache entries those tokens complete). `SmlaAttentionBackend.forward` has that shape:
it appends the rows to the sequence's cache on the server, attends, and returns the output.
The KV cache never lives in the frontend. Speculative decoding needs no extra call: a step that
starts at an earlier position replaces what was stored there, which rolls rejected drafts back.

The demo drives a short decode: sequences pre-filled past the sliding window, then rounds of
1 verify + 3 draft rows per sequence on several layers (SWA, SWA + top-k of a 1/2 cache,
SWA + top-k of a 1/1 cache), a random number of drafts accepted each round, inverse RoPE and
the LSE on, and MXFP8 output on one layer. Every output is checked against `NumpyReference`.

What the check proves: `NumpyReference` recomputes the operator of docs/operator.md (§5, §6)
in float64 NumPy from the rows this frontend sent, keeping its own per-layer history of
positions, sliding windows, compressed entries, top-k choices and rollbacks. It shares no code
with the server or the C++ client (nor its C++ reference), so agreement within the documented
tolerance means the server stored each row at the right position on the right layer, dropped
rejected drafts, built each row's key set (window, chosen or all compressed entries, causality)
as documented, and applied sinks, softmax scale, inverse RoPE and the output formats right.
The server runs with `kv=bf16` so that stored rows are exactly what was sent.

Run against a server (`--allow_shm` for the ring transport):

    build/server/smla-server --listen 127.0.0.1:50051 --allow_shm \\
        --model dsv4.1-flash:tp=8:kv=bf16:page_rows=16:pool=48MiB
    PYTHONPATH=build/python python3 examples/remote_attention.py --server 127.0.0.1:50051

or let it start one: `--server_binary build/server/smla-server`.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

import smla

MODEL_ARGS = "dsv4.1-flash:tp=8:kv=bf16:page_rows=16:pool=48MiB"


# ----------------------------------------------------------------------------------------------
# The backend adapter.


class SmlaAttentionBackend:
    """Per-layer attention over SMLA, the way an engine's attention backend is called.

    transport: 'unary' (one RPC per layer call), 'stream' (a StepStream), or 'ring' (a step ring
    in shared memory: the server must run on this host with --allow_shm).
    """

    def __init__(self, client, model, transport="stream", ring_slots=4):
        self.client = client
        self.model = model["profile"]
        self.heads = model["heads_per_rank"]
        self.width = model["qk_width"]
        self.layers = model["layers"]
        self.transport = transport
        self.stream = None
        self.ring = None
        if transport in ("stream", "ring"):
            self.stream = client.open_stream()
        if transport == "ring":
            # One region holds the ring and each step's tensors (placed from 0; the ring after).
            self.step_bytes = 16 << 20
            slot_bytes = 64 << 10
            self.region = smla.Region(client, "frontend", self.step_bytes +
                                      smla.StepRing.bytes_for(ring_slots, slot_bytes))
            self.ring = smla.StepRing(self.stream, self.region, self.step_bytes, ring_slots,
                                      slot_bytes)

    def new_sequence(self, request_id):
        return self.client.create_sequence(self.model, request_id)

    def forward(self, layer, batch, inverse_rope=True, want_lse=True, output_format="bf16"):
        """One layer for a batch of sequences.

        batch: list of dicts with sequence, first_position, kv_rows (bf16 bits [n, W]),
        q (bf16 bits [n, H, W]), drafts (how many of the rows are drafts), and where the layer
        needs them compressed_rows (bf16 bits [e, W]) and topk (int32 [n, K']).
        Returns the StepResult: out as bf16 bits [T, H, 512] (or MXFP8 codes and scales), and
        lse [T, H]; T = all rows in batch order.
        """
        spans = [
            smla.Span(b["sequence"], b["first_position"], b["kv_rows"], b["q"],
                      compressed_rows=b.get("compressed_rows"), topk=b.get("topk"),
                      drafts=b.get("drafts", 0)) for b in batch
        ]
        request = smla.StepRequest(self.model, layer, spans, output_format=output_format,
                                   want_lse=want_lse, inverse_rope=inverse_rope)
        if self.transport == "unary":
            return self.client.step(request)
        if self.transport == "stream":
            return self.stream.step(request)
        request.place(self.region, 0, layout="packed")
        result = self.ring.call(request)
        # The outputs are views of the region, overwritten by the next step: keep copies.
        return _Copied(result)

    def close(self, sequences):
        for s in sequences:
            self.client.release(s)
        if self.stream is not None:
            self.stream.writes_done()
            self.stream.finish()


class _Copied:
    def __init__(self, result):
        self.out = np.array(result.out)
        self.lse = None if result.lse is None else np.array(result.lse)
        self.mx_scales = None if result.mx_scales is None else np.array(result.mx_scales)


# ----------------------------------------------------------------------------------------------
# The independent NumPy reference of the operator.


def bf16_round(x):
    """float64 -> nearest bf16 value (ties to even), as float64."""
    return smla.bf16_to_float32(smla.float32_to_bf16(np.asarray(x, dtype=np.float32))).astype(
        np.float64)


class NumpyReference:
    """The caches of one model as the frontend wrote them, and what each step must return."""

    def __init__(self, model, sinks, cos_sin):
        self.model = model
        self.scale = float(model["softmax_scale"])
        self.sinks = sinks  # [layers, H]
        self.cos_sin = cos_sin  # [P, 64]
        self.rows = {}  # (sequence id, layer) -> float64 [length, W]
        self.entries = {}  # (sequence id, layer) -> float64 [count, W]

    def step(self, layer, batch, inverse_rope, output_format):
        info = self.model["layers"][layer]
        kind = info["kind"]
        r = info["compression_ratio"]
        window = info["window"]
        outs, lses = [], []
        for b in batch:
            key = (b["sequence"].id, layer)
            first = b["first_position"]
            kv = smla.bf16_to_float32(b["kv_rows"]).astype(np.float64)
            q = smla.bf16_to_float32(b["q"]).astype(np.float64)
            n = kv.shape[0]
            # Positions at or past `first` are replaced (rollback), then the rows appended.
            stored = self.rows.get(key, np.zeros((0, kv.shape[1])))
            assert first <= len(stored), "a position gap"
            self.rows[key] = stored = np.concatenate([stored[:first], kv])
            if r > 0:
                entries = self.entries.get(key, np.zeros((0, kv.shape[1])))
                comp = smla.bf16_to_float32(b["compressed_rows"]).astype(np.float64)
                assert len(comp) == (first + n) // r - first // r
                self.entries[key] = entries = np.concatenate([entries[:first // r], comp])
            for t in range(n):
                p = first + t
                keys = [stored[max(0, p - window + 1):p + 1]]
                if kind == "LAYER_KIND_SWA_TOPK":
                    visible = (p + 1) // r
                    chosen = [e for e in b["topk"][t] if e >= 0]
                    assert all(e < visible for e in chosen)
                    keys.append(entries[chosen])
                elif kind == "LAYER_KIND_SWA_ALL_COMPRESSED":
                    keys.append(entries[:(p + 1) // r])
                k = np.concatenate(keys)  # [keys, W]
                out, lse = self._attend(q[t], k, self.sinks[layer])
                if inverse_rope:
                    out = self._inverse_rope(bf16_round(out), p)
                outs.append(out)
                lses.append(lse)
        return np.stack(outs), np.stack(lses)

    def _attend(self, q, k, sink):
        """docs/operator.md §5 for one row: q [H, W], keys [n, W] (V = the first 512 lanes)."""
        s = self.scale * (q @ k.T)  # [H, n]
        m = np.maximum(s.max(axis=1), sink)
        e = np.exp(s - m[:, None])
        z = e.sum(axis=1) + np.exp(sink - m)
        out = (e @ k[:, :512]) / z[:, None]
        return out, m + np.log(z)

    def _inverse_rope(self, x, p):
        """docs/operator.md §6.2: GPT-J pairs on lanes 448..511 rotated back by position p."""
        c, s = self.cos_sin[p, :32], self.cos_sin[p, 32:]
        x = x.copy()
        even, odd = x[:, 448::2].copy(), x[:, 449::2].copy()
        x[:, 448::2] = even * c + odd * s
        x[:, 449::2] = odd * c - even * s
        return x


def check(name, result, ref_out, ref_lse, output_format, heads):
    """docs/operator.md §7: per (row, head), max|out - ref| <= 2e-2 * max|ref| (MXFP8: plus
    the rounding of one e4m3 step, 1/16 of the value); LSE within 2e-2 * max(1, |ref|)."""
    if output_format == "mxfp8":
        got = smla.decode_mxfp8(result.out, result.mx_scales, heads=heads).astype(np.float64)
        slack = np.abs(ref_out) / 16 + 2.0**-9 * np.abs(ref_out).max()
    else:
        got = smla.bf16_to_float32(result.out).astype(np.float64)
        slack = 0.0
    err = np.abs(got - ref_out) - slack
    bound = 2e-2 * np.abs(ref_out).max(axis=2, keepdims=True)
    if not np.all(err <= bound):
        worst = np.unravel_index(np.argmax(err - bound), err.shape)
        raise AssertionError(f"{name}: output {worst} is {got[worst]}, reference {ref_out[worst]}")
    lse_err = np.abs(result.lse - ref_lse)
    if not np.all(lse_err <= 2e-2 * np.maximum(1.0, np.abs(ref_lse))):
        raise AssertionError(f"{name}: LSE off by {lse_err.max()}")
    return float((np.abs(got - ref_out).max(axis=2) / np.abs(ref_out).max(axis=2)).max())


# ----------------------------------------------------------------------------------------------
# The demo: a frontend's decode loop with a fake model producing rows, queries and choices.


def rope_table(positions):
    theta = 10000.0**(-np.arange(32) / 32.0)
    angles = np.arange(positions)[:, None] * theta[None, :]
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


class FakeModel:
    """Stands in for the engine's layers and indexer: random rows, queries and top-k choices."""

    def __init__(self, model, seed):
        self.model = model
        self.rng = np.random.default_rng(seed)

    def inputs(self, sequence, layer, first, n, drafts):
        info = self.model["layers"][layer]
        h, w = self.model["heads_per_rank"], self.model["qk_width"]
        rand = lambda *shape: smla.float32_to_bf16(self.rng.uniform(-1, 1, shape))  # noqa: E731
        b = {"sequence": sequence, "first_position": first, "kv_rows": rand(n, w),
             "q": rand(n, h, w), "drafts": drafts}
        r = info["compression_ratio"]
        if r > 0:
            b["compressed_rows"] = rand((first + n) // r - first // r, w)
        if info["topk"] > 0:
            k = 16  # choices per row (at most the layer's topk); -1 pads rows with fewer
            topk = np.full((n, k), -1, dtype=np.int32)
            for t in range(n):
                visible = (first + t + 1) // r
                chosen = self.rng.choice(visible, size=min(k - 1, visible), replace=False)
                topk[t, :len(chosen)] = chosen
            b["topk"] = topk
        return b


def run(client, transport, layers, sequences=2, prefill=140, rounds=4, drafts=3, seed=7,
        verbose=True):
    model = next(m for m in client.info()["models"] if m["profile"] == "dsv4.1-flash")
    assert model["kv_format"] == "bf16", "run the server with kv=bf16 (see the docstring)"
    h = model["heads_per_rank"]
    rng = np.random.default_rng(seed)
    sinks = rng.uniform(-1, 1, (len(model["layers"]), h)).astype(np.float32)
    cos_sin = rope_table(4096)
    client.set_sinks(model["profile"], sinks)
    client.set_rope_table(model["profile"], cos_sin)

    backend = SmlaAttentionBackend(client, model, transport)
    ref = NumpyReference(model, sinks.astype(np.float64), cos_sin.astype(np.float64))
    fake = FakeModel(model, seed)
    seqs = [backend.new_sequence(f"{transport}-{os.getpid()}-{i}") for i in range(sequences)]
    worst = 0.0

    def forward(layer, batch, what):
        nonlocal worst
        fmt = "mxfp8" if layer == layers[-1] else "bf16"
        result = backend.forward(layer, batch, output_format=fmt)
        ref_out, ref_lse = ref.step(layer, batch, inverse_rope=True, output_format=fmt)
        worst = max(worst, check(f"{what}, layer {layer}", result, ref_out, ref_lse, fmt, h))

    # Pre-fill: one span per sequence, past the 128-position window.
    for layer in layers:
        forward(layer, [fake.inputs(s, layer, 0, prefill, 0) for s in seqs], "pre-fill")
    # Decode: 1 verify row at n and `drafts` draft rows; j drafts accepted, the next round
    # starts at n + j + 1 and so replaces the rejected ones.
    position = {s.id: prefill for s in seqs}
    rolled_back = 0
    for round_ in range(rounds):
        batches = {layer: [fake.inputs(s, layer, position[s.id], 1 + drafts, drafts)
                           for s in seqs] for layer in layers}
        for layer in layers:
            forward(layer, batches[layer], f"round {round_}")
        for s in seqs:
            accepted = int(rng.integers(0, drafts + 1))
            rolled_back += drafts - accepted
            position[s.id] += accepted + 1
    for s in seqs:
        for layer in layers:
            stored = client.length(s, layer)
            # The last round's rejected drafts are still stored until the next step replaces
            # them; what the frontend keeps is `position`.
            assert stored >= position[s.id], (stored, position[s.id])
        client.truncate(s, position[s.id])
        assert client.length(s, layers[0]) == position[s.id]
    backend.close(seqs)
    if verbose:
        print(f"remote_attention: {transport}: {sequences} sequences, layers {layers}, "
              f"{rounds} rounds of 1+{drafts} rows ({rolled_back} drafts rolled back), every "
              f"output within tolerance of the NumPy reference (worst {worst:.2e} of max|ref|)")
    return worst


def start_server(binary, extra):
    """Starts smla-server on loopback with free ports; returns (process, address). Its log goes
    to a temporary file (a pipe nobody reads would stall it)."""
    args = [binary, "--listen", "127.0.0.1:0", "--metrics_listen", "127.0.0.1:0", "--backend",
            "cpu", "--allow_shm", "--model", MODEL_ARGS] + extra
    log = tempfile.NamedTemporaryFile(mode="w+", prefix="smla-server.", suffix=".log")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    proc.log = log
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        log.seek(0)
        m = re.search(r"listening on (\S+:\d+)", log.read())
        if m:
            return proc, m.group(1)
        time.sleep(0.05)
    proc.kill()
    log.seek(0)
    raise RuntimeError("smla-server did not start:\n" + log.read())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", help="HOST:PORT of a running smla-server")
    p.add_argument("--server_binary", help="start this smla-server on loopback instead")
    p.add_argument("--transport", action="append", choices=["unary", "stream", "ring"],
                   help="repeatable (default: stream)")
    p.add_argument("--layers", default="0,2,20")
    p.add_argument("--token", default="")
    args = p.parse_args()
    proc = None
    if args.server_binary:
        proc, address = start_server(args.server_binary, [])
    elif args.server:
        address = args.server
    else:
        p.error("give --server or --server_binary")
    try:
        client = smla.Client(address, token=args.token)
        layers = [int(x) for x in args.layers.split(",")]
        for transport in args.transport or ["stream"]:
            run(client, transport, layers)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
