"""Shared-memory regions and the step ring: tensors by reference, outputs written in place,
ShmRegion::Place in both layouts, and ring steps, against the inline path and the reference."""

import numpy as np
import pytest

import smla
from conftest import MODEL, model_info, rows
from dlpack_producers import DLPackOnly
from remote_attention import FakeModel, NumpyReference, check


@pytest.fixture
def region(client):
    return smla.Region(client, "pytest", 8 << 20)


def span_inputs(rng, n=2):
    return rows(rng, n, 512), rows(rng, n, 8, 512)


def test_region_views(region):
    assert region.size == 8 << 20 and region.name
    a = region.array(64, (4, 512), np.uint16)
    b = region.array(64, 4 * 512 * 2, np.uint8)
    a[:] = 0x3F80
    assert b[:2].tolist() == [0x80, 0x3F]  # the same bytes
    with pytest.raises(ValueError, match="offset"):
        region.array(1, (2,), np.uint16)
    with pytest.raises(ValueError, match="bytes"):
        region.array(region.size - 2, (2,), np.uint16)
    assert "Region" in repr(region)


def test_inputs_in_a_region_travel_by_reference(client, region, new_id):
    """Arrays (and DLPack producers) that view a region become RegionRefs: the server reads
    what the region holds when the step runs, not when the request was built."""
    rng = np.random.default_rng(1)
    kv, q = span_inputs(rng)
    seq = client.create_sequence(MODEL, new_id())
    rkv = region.array(0, kv.shape, np.uint16)
    rq = region.array(4096, q.shape, np.uint16)
    rkv[:] = 0
    req = smla.StepRequest(MODEL, 0, [smla.Span(seq, 0, DLPackOnly(rkv), rq)])
    assert req.uses_regions()
    assert "inline_data" not in req.debug_string()
    rkv[:] = kv  # written after the request was built
    rq[:] = q
    by_ref = np.array(client.step(req).out)
    seq2 = client.create_sequence(MODEL, new_id())
    inline = client.step(smla.StepRequest(MODEL, 0, [smla.Span(seq2, 0, kv, q)]))
    assert not smla.StepRequest(MODEL, 0, [smla.Span(seq2, 0, kv, q)]).uses_regions()
    np.testing.assert_array_equal(by_ref, inline.out)


def test_outputs_written_into_a_region(client, region, new_id):
    rng = np.random.default_rng(2)
    kv, q = span_inputs(rng)
    seq = client.create_sequence(MODEL, new_id())
    out = region.array(1 << 20, (2, 8, 512), np.uint16)
    lse = region.array(2 << 20, (2, 8), np.float32)
    out[:] = 0
    req = smla.StepRequest(MODEL, 0, [smla.Span(seq, 0, kv, q)], want_lse=True, out=out,
                           lse_out=lse)
    assert "out_region" in req.debug_string()
    result = client.step(req)
    assert result.out is out and result.lse is lse
    seq2 = client.create_sequence(MODEL, new_id())
    inline = client.step(smla.StepRequest(MODEL, 0, [smla.Span(seq2, 0, kv, q)], want_lse=True))
    np.testing.assert_array_equal(out, inline.out)
    np.testing.assert_array_equal(lse, inline.lse)


@pytest.mark.parametrize("layout", ["per_span", "packed"])
def test_place(client, server, region, new_id, layout):
    model = model_info(client)
    ref = NumpyReference(model, server.sinks.astype(np.float64),
                         server.cos_sin.astype(np.float64))
    f = FakeModel(model, 4)
    seqs = [client.create_sequence(MODEL, new_id()) for _ in range(2)]
    batch = [f.inputs(s, 2, 0, 6, 2) for s in seqs]
    spans = [smla.Span(b["sequence"], 0, b["kv_rows"], b["q"], topk=b["topk"],
                       compressed_rows=b["compressed_rows"], drafts=2) for b in batch]
    req = smla.StepRequest(MODEL, 2, spans, want_lse=True, inverse_rope=True)
    need = req.bytes_for()  # of the inline request
    assert need > 0 and not req.uses_regions()
    end = req.place(region, 128, layout=layout)
    assert 128 < end <= 128 + need
    assert req.uses_regions() and "inline_data" not in req.debug_string()
    result = client.step(req)
    out, lse = ref.step(2, batch, True, "bf16")
    check(layout, result, out, lse, "bf16", 8)
    # The outputs are views of the region.
    assert result.out.ctypes.data >= region.array(0, 1, np.uint8).ctypes.data
    with pytest.raises(smla.OutOfRange):
        smla.StepRequest(MODEL, 2, spans).place(region, region.size - 64)
    with pytest.raises(ValueError, match="layout"):
        req.place(region, 0, layout="other")


def test_step_ring(client, server, new_id):
    model = model_info(client)
    ref = NumpyReference(model, server.sinks.astype(np.float64),
                         server.cos_sin.astype(np.float64))
    f = FakeModel(model, 5)
    slots, slot_bytes = 2, 4096
    steps = smla.Region(client, "steps", 4 << 20)
    ring_region = smla.Region(client, "ring", smla.StepRing.bytes_for(slots, slot_bytes))
    seq = client.create_sequence(MODEL, new_id())
    with client.open_stream() as stream:
        ring = smla.StepRing(stream, ring_region, 0, slots, slot_bytes)
        assert (ring.slots, ring.slot_bytes, ring.next_ticket) == (2, 4096, 1)
        ring.set_spin(5)
        first = 0
        for i, (n, drafts) in enumerate([(8, 0), (4, 3), (4, 3)]):
            batch = [f.inputs(seq, 0, first, n, drafts)]
            req = smla.StepRequest(MODEL, 0, [smla.Span(seq, first, batch[0]["kv_rows"],
                                                        batch[0]["q"], drafts=drafts)],
                                   want_lse=True, inverse_rope=True)
            req.place(steps, 0, layout="packed")
            result = ring.call(req)
            out, lse = ref.step(0, batch, True, "bf16")
            check(f"ring step {i}", result, out, lse, "bf16", 8)
            first += n - 2  # two drafts rejected each time
        # submit / wait, and a step's own error.
        a, b = [smla.StepRequest(MODEL, 0, [smla.Span(seq, first, *span_inputs(
            np.random.default_rng(k), 1))]) for k in range(2)]
        a.place(steps, 0, layout="packed")
        b.place(steps, 1 << 20, layout="packed")
        t1, t2 = ring.submit(a), ring.submit(b)  # both slots in flight
        assert ring.wait(t1).out.shape == (1, 8, 512)
        ring.wait(t2)
        gap = smla.StepRequest(MODEL, 0, [smla.Span(seq, first + 50, *span_inputs(
            np.random.default_rng(3), 1))])
        gap.place(steps, 0, layout="packed")
        with pytest.raises(smla.InvalidArgument):
            ring.call(gap)
        inline = smla.StepRequest(MODEL, 0, [smla.Span(seq, first, *span_inputs(
            np.random.default_rng(3), 1))])
        with pytest.raises(smla.InvalidArgument):
            ring.call(inline)  # ring steps must name regions
        # A second ring on the same stream is refused.
        with pytest.raises(smla.FailedPrecondition):
            smla.StepRing(stream, steps, 3 << 20, 1, 4096)
    with pytest.raises(smla.Unavailable):  # the stream ended, so did the ring
        ring.call(a, timeout=5)


def test_unregister(client, new_id):
    region = smla.Region(client, "gone", 1 << 20)
    rng = np.random.default_rng(4)
    seq = client.create_sequence(MODEL, new_id())
    req = smla.StepRequest(MODEL, 0, [smla.Span(seq, 0, *span_inputs(rng))])
    req.place(region)
    client.step(req)
    region.unregister()
    with pytest.raises(smla.NotFound, match=region.name):
        client.step(req)
    with pytest.raises(smla.FailedPrecondition):
        region.unregister()
