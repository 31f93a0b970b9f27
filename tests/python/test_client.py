"""Server info and health, the sequence lifecycle and the per-model tables."""

import numpy as np
import pytest

import smla
from conftest import MODEL, model_info, rows


def test_import_and_version():
    assert smla.__version__.count(".") == 2
    assert issubclass(smla.InvalidArgument, smla.Error)


def test_info_and_health(client):
    assert client.health()
    assert client.health("smla.v1.Smla")
    info = client.info()
    assert info["healthy"] is True
    assert info["server_version"]
    assert info["shm_socket"]  # --allow_shm
    assert info["limits"]["max_rows_per_step"] > 0
    m = model_info(client)
    assert m["heads_per_rank"] == 8 and m["qk_width"] == 512
    assert m["kv_format"] == "bf16" and m["geometry"] == "rope_inside"
    assert m["layers"][0]["kind"] == "LAYER_KIND_SWA"
    assert m["layers"][2] == {"kind": "LAYER_KIND_SWA_TOPK", "window": 128,
                              "compression_ratio": 2, "topk": 512}
    assert isinstance(m["pool"]["pages_total"], int)


def test_sequence_lifecycle(client, new_id):
    rng = np.random.default_rng(0)
    seq = client.create_sequence(MODEL, new_id())
    assert seq == smla.Sequence(MODEL, seq.id) and seq.model == MODEL
    assert client.length(seq, 0) == 0
    req = smla.StepRequest(MODEL, 0, [smla.Span(seq, 0, rows(rng, 10, 512),
                                                rows(rng, 10, 8, 512))])
    client.step(req)
    assert client.length(seq, 0) == 10
    assert client.length(seq, 1) == 0  # each layer has its own length
    client.truncate(seq, 4)
    assert client.length(seq, 0) == 4
    client.release(seq)
    with pytest.raises(smla.NotFound):
        client.length(seq, 0)


def test_tables(client, server):
    # Re-uploading valid tables is accepted (float64 is cast); a wrong shape is the server's
    # InvalidArgument.
    client.set_sinks(MODEL, server.sinks.astype(np.float64))
    client.set_rope_table(MODEL, server.cos_sin)
    with pytest.raises(smla.InvalidArgument):
        client.set_sinks(MODEL, np.zeros((3, 8), np.float32))
    with pytest.raises(smla.InvalidArgument, match="cos_sin"):
        client.set_rope_table(MODEL, np.zeros((16, 63), np.float32))
    with pytest.raises(ValueError):
        client.set_rope_table(MODEL, np.zeros(64, np.float32))


def test_client_options_are_checked(server):
    with pytest.raises(TypeError, match="no_such_option"):
        smla.Client(server.address, no_such_option=1)
    c = smla.Client(server.address, timeout=None, grpc_args={"grpc.keepalive_time_ms": 60000},
                    keep_freed_memory=False, max_message_bytes=64 << 20)
    assert c.health()
