"""Steps, unary and streamed: inputs from NumPy and DLPack, outputs as NumPy (bf16, MXFP8,
LSE, caller buffers), every output checked against the example's NumPy reference."""

import threading
import time

import numpy as np
import pytest

import smla
from conftest import MODEL, Server, DSV41, model_info, rows
from dlpack_producers import Bf16Tensor, DLPackOnly
from remote_attention import FakeModel, NumpyReference, check


@pytest.fixture
def ref(client, server):
    return NumpyReference(model_info(client), server.sinks.astype(np.float64),
                          server.cos_sin.astype(np.float64))


def fake(client, seed=3):
    return FakeModel(model_info(client), seed)


def request(batch, layer, **kw):
    spans = [smla.Span(b["sequence"], b["first_position"], b["kv_rows"], b["q"],
                       compressed_rows=b.get("compressed_rows"), topk=b.get("topk"),
                       drafts=b.get("drafts", 0)) for b in batch]
    return smla.StepRequest(MODEL, layer, spans, **kw)


@pytest.mark.parametrize("layer", [0, 2, 20])
def test_unary_steps_match_reference(client, ref, new_id, layer):
    f = fake(client)
    seqs = [client.create_sequence(MODEL, new_id()) for _ in range(2)]
    for first, n in [(0, 20), (20, 4), (22, 3)]:  # the last one rolls back two rows
        batch = [f.inputs(s, layer, first, n, 1) for s in seqs]
        result = client.step(request(batch, layer, want_lse=True, inverse_rope=True))
        assert result.out.dtype == np.uint16 and result.out.shape == (2 * n, 8, 512)
        assert result.lse.dtype == np.float32 and result.lse.shape == (2 * n, 8)
        out, lse = ref.step(layer, batch, True, "bf16")
        check(f"layer {layer} at {first}", result, out, lse, "bf16", 8)
    assert result.timings["batch_rows"] >= 3 and result.code == 0
    assert client.length(seqs[0], layer) == 25


def test_mxfp8_output_decodes(client, ref, new_id):
    f = fake(client)
    seq = client.create_sequence(MODEL, new_id())
    batch = [f.inputs(seq, 0, 0, 6, 0)]
    result = client.step(request(batch, 0, output_format="mxfp8", want_lse=True))
    assert result.out.dtype == np.uint8 and result.out.shape == (6, 8 * 512)
    assert result.mx_scales.shape == (6, 8 * 16)
    out, lse = ref.step(0, batch, False, "mxfp8")
    check("mxfp8", result, out, lse, "mxfp8", 8)


def encode_mxfp8_query(values):
    """An independent MXFP8 encoder for the test: scale 2^ceil(log2(amax/448)), nearest code."""
    v = values.reshape(*values.shape[:-1], -1, 32).astype(np.float64)
    amax = np.maximum(np.abs(v).max(axis=-1), 2.0**-126)
    e = np.clip(np.ceil(np.log2(amax / 448)) + 127, 0, 254)
    scaled = v * np.exp2(127 - e)[..., None]
    table = smla.tensors.E4M3_VALUES
    finite = np.where(np.isnan(table), np.inf, table).astype(np.float64)
    codes = np.abs(scaled[..., None] - finite).argmin(axis=-1).astype(np.uint8)
    return codes.reshape(values.shape), e.astype(np.uint8)


def test_mxfp8_query(client, ref, new_id):
    f = fake(client)
    seq = client.create_sequence(MODEL, new_id())
    batch = [f.inputs(seq, 0, 0, 4, 0)]
    q = smla.bf16_to_float32(batch[0]["q"])
    codes, scales = encode_mxfp8_query(q)
    sent = smla.decode_mxfp8_query(codes, scales)
    assert np.abs(sent - q).max() <= np.abs(q).max() / 8
    span = smla.Span(seq, 0, batch[0]["kv_rows"], codes, q_scales=scales)
    result = client.step(smla.StepRequest(MODEL, 0, [span], want_lse=True))
    batch[0]["q"] = smla.float32_to_bf16(sent)  # what the server expands: exact in bf16
    out, lse = ref.step(0, batch, False, "bf16")
    check("mxfp8 query", result, out, lse, "bf16", 8)


def test_stream_steps(client, ref, new_id):
    f = fake(client)
    seq = client.create_sequence(MODEL, new_id())
    with client.open_stream() as stream:
        batches = [[f.inputs(seq, 0, 0, 8, 0)], [f.inputs(seq, 0, 8, 4, 3)],
                   [f.inputs(seq, 0, 10, 4, 3)]]
        for b in batches:  # pipelined: all written before any read
            stream.write(request(b, 0, want_lse=True, inverse_rope=True))
        for i, b in enumerate(batches):
            result = stream.read()
            out, lse = ref.step(0, b, True, "bf16")
            check(f"stream step {i}", result, out, lse, "bf16", 8)
        # A failed step raises and the stream goes on.
        with pytest.raises(smla.InvalidArgument, match="gap|first_position"):
            stream.step(request([f.inputs(seq, 0, 99, 1, 0)], 0))
        b = [f.inputs(seq, 0, 14, 1, 0)]
        result = stream.step(request(b, 0, want_lse=True, inverse_rope=True))
        out, lse = ref.step(0, b, True, "bf16")
        check("after the error", result, out, lse, "bf16", 8)
        stream.writes_done()
        assert stream.read() is None
        stream.finish()


def test_inputs_numpy_float32_and_dlpack(client, new_id):
    """The same step from uint16 bits, float32 (rounded), a __dlpack__-only producer, a
    hand-built bfloat16 DLPack tensor and non-contiguous arrays gives the same bits."""
    rng = np.random.default_rng(5)
    kv32 = rng.uniform(-1, 1, (3, 512)).astype(np.float32)
    q32 = rng.uniform(-1, 1, (3, 8, 512)).astype(np.float32)
    kv, q = smla.float32_to_bf16(kv32), smla.float32_to_bf16(q32)
    q_wide = np.zeros((3, 8, 1024), np.uint16)
    q_wide[:, :, ::2] = q
    deleted = Bf16Tensor.deleted
    variants = {
        "uint16": (kv, q),
        "float32": (kv32, q32),
        "dlpack": (DLPackOnly(kv), DLPackOnly(q)),
        "bf16 dlpack": (Bf16Tensor(kv), Bf16Tensor(q)),
        "strided": (np.asfortranarray(kv), q_wide[:, :, ::2]),
        "lists": (smla.bf16_to_float32(kv).tolist(), q),  # float64, exact in bf16
    }
    outs = {}
    for name, (k, qq) in variants.items():
        seq = client.create_sequence(MODEL, new_id())
        outs[name] = np.array(client.step(
            smla.StepRequest(MODEL, 0, [smla.Span(seq, 0, k, qq)])).out)
    for name, out in outs.items():
        np.testing.assert_array_equal(out, outs["uint16"], err_msg=name)
    assert Bf16Tensor.deleted == deleted + 2  # each capsule's deleter ran once


def test_input_type_errors(client, new_id):
    seq = client.create_sequence(MODEL, new_id())
    kv = np.zeros((1, 512), np.uint16)
    with pytest.raises(TypeError, match="spans\\[0\\].q: dtype complex128"):
        smla.StepRequest(MODEL, 0, [smla.Span(seq, 0, kv, np.zeros((1, 8, 512), complex))])
    with pytest.raises(TypeError, match="device type 2"):
        smla.StepRequest(MODEL, 0, [smla.Span(seq, 0, Bf16Tensor(kv, device_type=2), kv)])
    with pytest.raises(ValueError, match="output_format"):
        smla.StepRequest(MODEL, 0, [smla.Span(seq, 0, kv, kv)], output_format="fp4")


def test_outputs_into_caller_buffers(client, new_id):
    rng = np.random.default_rng(6)
    seq = client.create_sequence(MODEL, new_id())
    out = np.full((2, 8, 512), 0xFFFF, np.uint16)
    lse = np.full((2, 8), np.nan, np.float32)
    span = smla.Span(seq, 0, rows(rng, 2, 512), rows(rng, 2, 8, 512))
    req = smla.StepRequest(MODEL, 0, [span], want_lse=True, out=out, lse_out=lse)
    result = client.step(req)
    assert result.out is out and result.lse is lse
    assert not np.isnan(lse).any() and (out != 0xFFFF).all()
    plain = client.step(smla.StepRequest(MODEL, 0, [span], want_lse=True))
    np.testing.assert_array_equal(plain.out, out)
    np.testing.assert_array_equal(plain.lse, lse)
    # MXFP8 into buffers; a buffer of the wrong size or dtype is refused.
    codes, scales = np.zeros((2, 4096), np.uint8), np.zeros((2, 128), np.uint8)
    r = client.step(smla.StepRequest(MODEL, 0, [span], output_format="mxfp8", out=codes,
                                     mx_scales_out=scales))
    assert r.out is codes and r.mx_scales is scales and scales.any()
    with pytest.raises(ValueError, match="out"):
        client.step(smla.StepRequest(MODEL, 0, [span], out=np.zeros((1, 8, 512), np.uint16)))
    with pytest.raises(TypeError, match="out"):
        smla.StepRequest(MODEL, 0, [span], out=np.zeros((2, 8, 512), np.float32))
    with pytest.raises(TypeError, match="read-only"):
        ro = np.zeros((2, 8, 512), np.uint16)
        ro.flags.writeable = False
        smla.StepRequest(MODEL, 0, [span], out=ro)


def test_result_views_outlive_the_call(client, new_id):
    rng = np.random.default_rng(7)
    seq = client.create_sequence(MODEL, new_id())
    result = client.step(smla.StepRequest(
        MODEL, 0, [smla.Span(seq, 0, rows(rng, 1, 512), rows(rng, 1, 8, 512))]))
    out = result.out
    copy = np.array(out)
    del result
    np.testing.assert_array_equal(out, copy)  # the view holds the response alive


def test_gil_released_during_calls():
    """A step that takes 300 ms on the server leaves Python threads running meanwhile."""
    s = Server([DSV41, "--inject_attend_delay_ms=300"])
    try:
        c = smla.Client(s.address)
        m = model_info(c)
        c.set_sinks(MODEL, np.zeros((len(m["layers"]), 8), np.float32))
        seq = c.create_sequence(MODEL, "gil")
        req = smla.StepRequest(MODEL, 0, [smla.Span(seq, 0, np.zeros((1, 512), np.uint16),
                                                    np.zeros((1, 8, 512), np.uint16))])
        done = threading.Event()
        ticks = 0

        def call():
            c.step(req)
            done.set()

        t = threading.Thread(target=call)
        start = time.monotonic()
        t.start()
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)
        t.join()
        assert time.monotonic() - start >= 0.25
        assert ticks >= 5, ticks  # with the GIL held during the call this thread gets ~1
    finally:
        s.terminate()
