"""Tokens, tenants, TLS and mTLS through the Python client."""

import os
import subprocess
import tempfile

import numpy as np
import pytest

import smla
from conftest import MODEL, DSV41, Server, rows


@pytest.fixture(scope="module")
def tmpdir_():
    with tempfile.TemporaryDirectory(prefix="smla-py-sec-") as d:
        yield d


def write_tokens(d):
    path = os.path.join(d, "tokens")
    with open(path, "w") as f:
        f.write("# token tenant\ntok-alice-1234 alice\ntok-bob-5678 bob\n")
    os.chmod(path, 0o600)
    return path


def make_certs(d):
    """A CA, a server certificate for 127.0.0.1 / localhost and a client certificate (CN=carol),
    as tests/integration/security_test.cc makes them."""
    script = """set -e
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca -keyout ca.key -out ca.pem
openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile san.ext -out server.pem
openssl req -newkey rsa:2048 -nodes -subj /CN=carol -keyout client.key -out client.csr
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out client.pem
"""
    subprocess.run(["bash", "-c", script], cwd=d, check=True, capture_output=True)


def test_tokens_and_tenants(tmpdir_):
    s = Server([DSV41, "--allow_shm", "--token_file=" + write_tokens(tmpdir_)])
    try:
        with pytest.raises(smla.Unauthenticated):
            smla.Client(s.address).info()
        with pytest.raises(smla.Unauthenticated):
            smla.Client(s.address, token="tok-wrong").info()
        assert smla.Client(s.address).health()  # probes need no token
        alice = smla.Client(s.address, token="tok-alice-1234")
        bob = smla.Client(s.address, token="tok-bob-5678")
        alice.set_sinks(MODEL, np.zeros((40, 8), np.float32))
        a = alice.create_sequence(MODEL, "same-id")
        b = bob.create_sequence(MODEL, "same-id")  # tenants have their own ids
        rng = np.random.default_rng(1)
        kv, q = rows(rng, 1, 512), rows(rng, 1, 8, 512)
        alice.step(smla.StepRequest(MODEL, 0, [smla.Span(a, 0, kv, q)]))
        assert alice.length(a, 0) == 1 and bob.length(b, 0) == 0
        # Bob names alice's region.
        region = smla.Region(alice, "alice", 1 << 20)
        req = smla.StepRequest(MODEL, 0, [smla.Span(b, 0, kv, q)])
        req.place(region)
        with pytest.raises(smla.PermissionDenied, match="another tenant"):
            bob.step(req)
    finally:
        s.terminate()


def test_tls_and_mtls(tmpdir_):
    make_certs(tmpdir_)
    p = lambda name: os.path.join(tmpdir_, name)  # noqa: E731
    s = Server([DSV41, "--tls_cert=" + p("server.pem"), "--tls_key=" + p("server.key"),
                "--tls_client_ca=" + p("ca.pem")])
    try:
        with pytest.raises(smla.Unavailable):
            smla.Client(s.address, timeout=5).info()  # plaintext to a TLS port
        with pytest.raises(smla.Unavailable):  # TLS without a client certificate
            smla.Client(s.address, timeout=5, tls_ca=p("ca.pem")).info()
        c = smla.Client(s.address, tls_ca=p("ca.pem"), tls_cert=p("client.pem"),
                        tls_key=p("client.key"), tls_server_name="localhost")
        assert c.info()["healthy"]
        assert c.create_sequence(MODEL, "carol's").id == "carol's"
        with pytest.raises(smla.InvalidArgument, match="together"):
            smla.Client(s.address, tls_cert=p("client.pem"))
    finally:
        s.terminate()
