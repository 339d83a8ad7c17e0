"""The transfer guard and the thread guard on a real 2-process cluster (one for the module)."""

from __future__ import annotations

import argparse
import time

import pytest

from jaxsys_kernel import Cluster
from jaxsys_kernel import cells as executor
from jaxsys_kernel.magics import actions_guard
from jaxsys_kernel.magics.session import MultihostSession


class Capture(executor.Sink):
    def __init__(self):
        super().__init__()
        self.out: list[str] = []
        self.err: list[str] = []

    def stdout(self, text):
        self.out.append(text)

    def stderr(self, text):
        self.err.append(text)


@pytest.fixture(scope="module")
def world():
    c = Cluster(hosts=2, devices_per_host=2, progress=lambda e: None)
    c.start_sync()
    session = MultihostSession()
    session.cluster = c
    yield {"cluster": c, "session": session}
    c.kill()


def run(cluster, code):
    sink = Capture()
    r = executor.execute(cluster, code, sink=sink)
    return r, sink


def guard(session, capsys, level=None, **kw):
    args = argparse.Namespace(level=level, h2d=None, d2h=None, d2d=None, reset_counts=False)
    vars(args).update(kw)
    actions_guard.transfer_guard(session, args)
    return capsys.readouterr().out


def test_disallow_raises_on_every_process_naming_the_transfer(world, capsys):
    c, s = world["cluster"], world["session"]
    out = guard(s, capsys, "disallow")
    assert "[p0-1] transfer guard h2d=disallow d2h=disallow d2d=disallow" in out
    try:
        r, _ = run(
            c, "import jax, jax.numpy as jnp, numpy as np\njnp.add(np.ones(3, np.float32), 1)"
        )
        errors = {rank: p.error for rank, p in r.results.items()}
        assert set(errors) == {0, 1}
        for rank, err in errors.items():
            assert err["ename"] == "TransferGuardError", err
            v = err["evalue"]
            assert v.startswith("host-to-device transfer of shape (3), dtype float32"), v
            assert f"on process {rank}" in v and "device cpu:" in v, v
        # Each process names its own first device.
        assert "cpu:0" in errors[0]["evalue"] and "cpu:2048" in errors[1]["evalue"]
    finally:
        guard(s, capsys, "allow")
    r, _ = run(c, "jnp.add(np.ones(3, np.float32), 1)")
    assert not any(p.error for p in r.results.values())


def test_log_lines_reach_the_cell_and_are_counted(world, capsys):
    c, s = world["cluster"], world["session"]
    guard(s, capsys, "log", reset_counts=True)
    dash = s.show_dashboard()
    try:
        r, sink = run(
            c,
            "import jax, jax.numpy as jnp, numpy as np\n"
            "for _ in range(3):\n    jnp.add(np.ones(3, np.float32), 1.0)\n",
        )
        assert not any(p.error for p in r.results.values())
        text = "".join(sink.err + sink.out)
        assert "host-to-device transfer: aval=ShapedArray(float32[3])" in text, text
        out = guard(s, capsys)
    finally:
        guard(s, capsys, "allow")
    # Each add moves the array and the Python scalar: 6 logged transfers per process.
    assert (
        "[p0-1] transfer guard h2d=log d2h=log d2d=log; logged transfers: 6 h2d, 0 d2h, 0 d2d"
        in out
    ), out
    # The same counts reach the kernel's telemetry, which feeds the dashboard.
    want = {"host-to-device": 6, "device-to-host": 0, "device-to-device": 0}
    deadline = time.monotonic() + 15
    while c.telemetry.transfer_counts() != {0: want, 1: want}:
        assert time.monotonic() < deadline, c.telemetry.transfer_counts()
        time.sleep(0.05)
    line = "transfers logged: [p0-1] 6 h2d, 0 d2h, 0 d2d"
    while not any(line in entry for entry in dash.live.event_log):
        assert time.monotonic() < deadline, dash.live.event_log
        time.sleep(0.05)
    # ... and its table, a column per process.
    while [p.get("transfers") for p in dash.live.liveness] != [want, want]:
        assert time.monotonic() < deadline, dash.live.liveness
        time.sleep(0.05)
