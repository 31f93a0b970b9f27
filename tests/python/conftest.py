"""Fixtures of the Python client tests: real smla-server processes on loopback (CPU backend
unless SMLA_TEST_BACKEND says otherwise), as tests/integration/server_process.cc runs them."""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import smla

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

# A small DeepSeek-V4.1 rank (8 heads) storing bf16 rows, so the NumPy reference is exact.
DSV41 = "--model=dsv4.1-flash:tp=8:kv=bf16:page_rows=16:pool=48MiB"
MODEL = "dsv4.1-flash"


def server_binary():
    path = os.environ.get("SMLA_SERVER_BINARY") or os.environ.get("SMLA_BUILT_SERVER_BINARY")
    if not path:
        pytest.skip("no smla-server: set SMLA_SERVER_BINARY (ctest sets it)")
    return path


class Server:
    """smla-server --listen 127.0.0.1:0 ... plus `args`; its log in a temporary file."""

    def __init__(self, args):
        backend = os.environ.get("SMLA_TEST_BACKEND", "cpu")
        self.log = tempfile.NamedTemporaryFile(mode="w+", prefix="smla-server.", suffix=".log")
        self.proc = subprocess.Popen(
            [server_binary(), "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
             f"--backend={backend}", "--cpu_threads=1"] + list(args),
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            text = self.read_log()
            m = re.search(r"listening on (\S+:\d+)", text)
            if m:
                self.address = m.group(1)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.kill()
        raise RuntimeError("smla-server did not start:\n" + self.read_log())

    def read_log(self):
        self.log.seek(0)
        return self.log.read()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def terminate(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def server():
    """The shared server: regions allowed, sinks and rope table uploaded once."""
    s = Server([DSV41, "--allow_shm"])
    c = smla.Client(s.address)
    model = model_info(c)
    rng = np.random.default_rng(1)
    s.sinks = rng.uniform(-1, 1, (len(model["layers"]), model["heads_per_rank"])).astype(
        np.float32)
    from remote_attention import rope_table
    s.cos_sin = rope_table(1024)
    c.set_sinks(MODEL, s.sinks)
    c.set_rope_table(MODEL, s.cos_sin)
    yield s
    s.terminate()


@pytest.fixture
def client(server):
    return smla.Client(server.address)


def model_info(client, name=MODEL):
    return next(m for m in client.info()["models"] if m["profile"] == name)


_ids = iter(range(1 << 30))


@pytest.fixture
def new_id(request):
    """Fresh sequence ids (the shared server keeps every test's sequences apart)."""
    return lambda: f"{request.node.name[:40]}-{next(_ids)}"


def rows(rng, *shape):
    return smla.float32_to_bf16(rng.uniform(-1, 1, shape))
