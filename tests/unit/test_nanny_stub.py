"""The engine's side of a forked nanny (engine/nanny_stub.py), over real pipes: what it
hands the stub, and ipyparallel's own start when the stub cannot serve. The stub itself
runs in the Kubernetes kernel test (tests/live/test_kubernetes_kernel.py)."""

from __future__ import annotations

import os
import pickle

import pytest

from jaxsys_kernel.engine import nanny_stub

pytestmark = pytest.mark.unit


def _stub(reply: bytes):
    """A stub whose side is played by this test: what it will answer, and where the
    arguments arrive."""
    r_args, w_args = os.pipe()
    r_url, w_url = os.pipe()
    os.write(w_url, reply)
    os.close(w_url)
    return nanny_stub.Stub(4321, w_args, r_url), r_args


def test_only_engines_with_a_nanny_fork_a_stub():
    assert nanny_stub.wanted(["--IPEngine.id=3", "--IPEngine.max_heartbeat_misses=20"])
    assert not nanny_stub.wanted(["--IPEngine.enable_nanny=False"])
    assert not nanny_stub.wanted(["--ipengine.enable_nanny=false"])


def test_the_stub_gets_the_arguments_and_the_engine_the_nannys_address():
    stub, r_args = _stub(b"tcp://127.0.0.1:5555\n")

    def fallback(**kwargs):
        raise AssertionError("ipyparallel's own start was not needed")

    url, handle = stub.start(fallback, engine_id=3, control_url="tcp://x:1")
    assert url == "tcp://127.0.0.1:5555" and handle.pid == 4321
    with os.fdopen(r_args, "rb") as r:
        sent = pickle.loads(r.read())
    assert sent == {"engine_id": 3, "control_url": "tcp://x:1", "pid": os.getpid()}
    # The pipe the nanny watches stays open while the engine keeps the handle.
    assert not handle.stdout.closed
    handle.stdout.close()


def test_a_stub_that_answers_nothing_leaves_the_start_to_ipyparallel():
    stub, r_args = _stub(b"")
    calls = []
    got = stub.start(lambda **kw: calls.append(kw) or ("tcp://own:1", "popen"), engine_id=1)
    assert got == ("tcp://own:1", "popen")
    with pytest.raises(OSError):
        os.fstat(stub.from_stub)  # the stub's silent pipe is not left open
    # ipyparallel's start is given the arguments as the engine gave them (it adds the pid).
    assert calls == [{"engine_id": 1}]
    os.close(r_args)
