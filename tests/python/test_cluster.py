"""smla.Cluster over two servers: placement, routing, streams through client_for, tables on
every server, and a server's death reported as lost sequences (DataLoss)."""

import numpy as np
import pytest

import smla
from conftest import MODEL, DSV41, Server, rows


def test_cluster():
    servers = [Server([DSV41]), Server([DSV41])]
    try:
        cl = smla.Cluster([s.address for s in servers], probe_timeout=1.0, timeout=10)
        assert sorted(cl.servers()) == sorted(s.address for s in servers)
        assert cl.live_servers() == cl.servers()
        cl.set_sinks(MODEL, np.zeros((40, 8), np.float32))  # to every live server
        seqs = [cl.create_sequence(MODEL, f"s{i}") for i in range(8)]
        where = {s.id: cl.server_of(s) for s in seqs}
        assert set(where.values()) == set(cl.servers())  # both used (fixed hash, 8 ids)
        rng = np.random.default_rng(1)
        for s in seqs:
            cl.step(smla.StepRequest(MODEL, 0, [smla.Span(s, 0, rows(rng, 3, 512),
                                                          rows(rng, 3, 8, 512))]))
            assert cl.length(s, 0) == 3
        cl.truncate(seqs[0], 1)
        assert cl.length(seqs[0], 0) == 1
        # A stream to one sequence's server.
        c = cl.client_for(seqs[1])
        with c.open_stream() as stream:
            r = stream.step(smla.StepRequest(MODEL, 0, [smla.Span(
                seqs[1], 3, rows(rng, 1, 512), rows(rng, 1, 8, 512))]))
            assert r.out.shape == (1, 8, 512)
        with pytest.raises(smla.NotFound):
            cl.server_of(smla.Sequence(MODEL, "unknown"))
        # One server dies: its sequences are lost, the others go on.
        dead = servers[0].address
        servers[0].kill()
        lost = [s for s in seqs if where[s.id] == dead]
        kept = [s for s in seqs if where[s.id] != dead]
        with pytest.raises(smla.DataLoss, match=lost[0].id):
            cl.length(lost[0], 0)
        assert cl.live_servers() == [servers[1].address]
        assert f"{MODEL}/{lost[0].id}" in cl.lost_sequences()
        assert cl.report_failure(dead) is False
        cl.refresh()
        assert all(cl.length(s, 0) >= 1 for s in kept)
        for s in lost:
            cl.release(s)  # acknowledges the loss
        assert cl.lost_sequences() == []
        new = cl.create_sequence(MODEL, "after")
        assert cl.server_of(new) == servers[1].address
    finally:
        for s in servers:
            s.kill()
