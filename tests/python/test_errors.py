"""Every status the server or the library reports arrives as its smla.errors class, with the
server's message."""

import socket
import time

import numpy as np
import pytest

import smla
from conftest import MODEL, DSV41, Server, rows

GLM53 = "--model=glm-5.3-flash:tp=8:page_rows=16:pool=32MiB"


def one_row(seq, first=0, rng=None, width=512):
    rng = rng or np.random.default_rng(0)
    return smla.StepRequest(seq.model, 0, [smla.Span(seq, first, rows(rng, 1, width),
                                                     rows(rng, 1, 8, width))])


def test_every_code_has_a_class():
    names = {1: "Cancelled", 2: "Unknown", 3: "InvalidArgument", 4: "DeadlineExceeded",
             5: "NotFound", 6: "AlreadyExists", 7: "PermissionDenied", 8: "ResourceExhausted",
             9: "FailedPrecondition", 10: "Aborted", 11: "OutOfRange", 12: "Unimplemented",
             13: "Internal", 14: "Unavailable", 15: "DataLoss", 16: "Unauthenticated"}
    for code, name in names.items():
        with pytest.raises(getattr(smla, name)) as e:
            smla._smla._raise_status(code, f"message {code}")
        assert isinstance(e.value, smla.Error)
        assert e.value.code == code and str(e.value) == e.value.message == f"message {code}"
    assert smla.errors.from_status(99, "x").__class__ is smla.Error


def test_server_errors(client, new_id):
    seq = client.create_sequence(MODEL, new_id())
    with pytest.raises(smla.AlreadyExists):
        client.create_sequence(MODEL, seq.id)
    with pytest.raises(smla.NotFound, match="no-such-model"):
        client.create_sequence("no-such-model", "x")
    with pytest.raises(smla.NotFound):
        client.release(smla.Sequence(MODEL, "never-created"))
    # InvalidArgument names the field, and a failed step writes nothing.
    rng = np.random.default_rng(1)
    bad = smla.StepRequest(MODEL, 0, [smla.Span(seq, 0, rows(rng, 2, 500),
                                                rows(rng, 2, 8, 512))])
    with pytest.raises(smla.InvalidArgument, match="kv_rows") as e:
        client.step(bad)
    assert e.value.code_name == "INVALID_ARGUMENT"
    gap = one_row(seq, first=5)
    with pytest.raises(smla.InvalidArgument, match="first_position"):
        client.step(gap)
    assert client.length(seq, 0) == 0
    with pytest.raises(smla.InvalidArgument, match="256"):
        client.create_sequence(MODEL, "x" * 300)
    # A cancelled stream.
    stream = client.open_stream()
    stream.cancel()
    with pytest.raises(smla.Cancelled):
        stream.finish()


def test_unavailable_when_nobody_listens():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    c = smla.Client(f"127.0.0.1:{port}", timeout=5)
    with pytest.raises(smla.Unavailable):
        c.info()


def test_state_and_limits():
    """A fresh server: steps before the sinks are uploaded, sequences past max_sequences,
    regions on a server that takes none."""
    s = Server([DSV41, "--max_sequences=1"])
    try:
        c = smla.Client(s.address)
        seq = c.create_sequence(MODEL, "a")
        with pytest.raises(smla.FailedPrecondition, match="sink"):
            c.step(one_row(seq))
        with pytest.raises(smla.ResourceExhausted):
            c.create_sequence(MODEL, "b")
        with pytest.raises(smla.FailedPrecondition):
            smla.Region(c, "no-shm", 1 << 16)
    finally:
        s.terminate()


def test_backend_failure():
    """An injected backend failure is Internal; the server then turns unhealthy (Unavailable)."""
    s = Server([GLM53, "--inject_backend_failure_after=1"])
    try:
        c = smla.Client(s.address)
        seq = c.create_sequence("glm-5.3-flash", "s")
        rng = np.random.default_rng(2)
        topk = np.zeros((1, 1), np.int32)

        def step(first):
            return c.step(smla.StepRequest("glm-5.3-flash", 0, [smla.Span(
                seq, first, rows(rng, 1, 512), rows(rng, 1, 8, 512), topk=topk)]))

        step(0)
        with pytest.raises(smla.Internal, match="injected"):
            step(1)
        for _ in range(200):  # the health status flips asynchronously
            if not c.health():
                break
            time.sleep(0.01)
        assert not c.health()
        with pytest.raises(smla.Unavailable):
            step(1)
    finally:
        s.kill()


def test_deadlines():
    """A step that takes 300 ms on the server, under a 50 ms deadline."""
    s = Server([DSV41, "--inject_attend_delay_ms=300"])
    try:
        c = smla.Client(s.address)
        c.set_sinks(MODEL, np.zeros((40, 8), np.float32))
        seq = c.create_sequence(MODEL, "slow")
        with pytest.raises(smla.DeadlineExceeded):
            c.step(one_row(seq), timeout=0.05)
        c.step(one_row(seq), timeout=10)
    finally:
        s.terminate()
