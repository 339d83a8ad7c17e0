"""The example language model trains through a restart and a preemption, bit for bit.

One 2-process x 1-device cluster for the module. A reference run trains 12 steps without a
stop; every other run must end with the same fingerprint (a SHA-256 of every parameter and
optimizer array, gathered whole).
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import pytest

from jaxsys_kernel import Cluster
from jaxsys_kernel import cells as executor

STEPS = 12
EVERY = 4

SETUP = "import json, os, time, jax\nfrom jaxsys_kernel.examples import train\n"

# Each process prints its own line (its index is in it, so the lines are never merged).
TRAIN = """r = train.train({steps}, {ckpt!r}, every={every}, log_every=0{extra})
r = {{k: r[k] for k in ("step", "start", "preempted", "fingerprint")}}
print("RESULT", jax.process_index(), json.dumps(r))
"""

# After every step process 0 leaves a mark the test waits for, and each step is slowed
# down so that a signal sent at step 2 lands long before step 12.
MARKED = ", after_step=lambda s: (jax.process_index() == 0 and open(os.path.join({marks!r}, str(s)), 'w').close(), time.sleep(0.3))"


class Capture(executor.Sink):
    def __init__(self):
        super().__init__()
        self.out: list[str] = []

    def stdout(self, text):
        self.out.append(text)

    stderr = stdout


def ok(cluster, code) -> str:
    sink = Capture()
    r = executor.execute(cluster, code, sink=sink, timeout=120)
    errors = {k: p.error["evalue"] for k, p in r.results.items() if p.error}
    assert not errors, (errors, "".join(sink.out))
    return "".join(sink.out)


def train(cluster, steps, ckpt, extra="") -> dict[int, dict]:
    """Each process's result of ``train.train``."""
    out = ok(cluster, TRAIN.format(steps=steps, ckpt=str(ckpt), every=EVERY, extra=extra))
    found = {int(m[1]): json.loads(m[2]) for m in re.finditer(r"RESULT (\d+) (\{.*\})", out)}
    assert sorted(found) == [0, 1], out
    return found


@pytest.fixture(scope="module")
def cluster(tag):
    c = Cluster(hosts=2, devices_per_host=1, progress=lambda e: None)
    c.start_sync()
    ok(c, SETUP)
    yield c
    c.kill()


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory) -> str:
    """The fingerprint of an undisturbed 12-step run."""
    got = train(cluster, STEPS, tmp_path_factory.mktemp("reference"))
    assert got[0] == got[1] and got[0]["step"] == STEPS and got[0]["start"] == 0
    return got[0]["fingerprint"]


def restart(cluster):
    cluster.restart_sync()
    ok(cluster, SETUP)


def test_resumed_after_a_restart_equals_the_reference(cluster, reference, tmp_path):
    first = train(cluster, EVERY, tmp_path)
    assert first[0]["step"] == EVERY and first[0]["fingerprint"] != reference
    restart(cluster)
    resumed = train(cluster, STEPS, tmp_path)
    for r in resumed.values():
        assert r["start"] == EVERY and r["step"] == STEPS
        assert r["fingerprint"] == reference


def _terminate_at(cluster, marks, step: int, sent: list) -> None:
    """SIGTERM to process 1 once process 0 has finished ``step``."""
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(marks, str(step))):
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    os.kill(cluster.processes[1].pid, signal.SIGTERM)
    sent.append(step)


def test_sigterm_to_one_process_saves_the_same_step_everywhere(cluster, reference, tmp_path):
    # JAX's preemption sync point counts one run's steps per world: a world that already
    # trained to step 12 would pick a step past the new run's end.
    restart(cluster)
    marks, ckpt = tmp_path / "marks", tmp_path / "ckpt"
    marks.mkdir()
    sent: list[int] = []
    sender = threading.Thread(target=_terminate_at, args=(cluster, str(marks), 2, sent))
    sender.start()
    got = train(cluster, STEPS, ckpt, extra=MARKED.format(marks=str(marks)))
    sender.join()
    assert sent == [2]
    saved = got[0]["step"]
    assert got[0] == got[1], got  # the same step, the same bits, on both processes
    assert got[0]["preempted"] and 2 < saved < STEPS, got
    assert str(saved) in os.listdir(ckpt)
    # Both processes returned cleanly and are still running; a fresh world resumes.
    assert all(p.state == "ready" for p in cluster.processes)
    restart(cluster)
    resumed = train(cluster, STEPS, ckpt)
    for r in resumed.values():
        assert r["start"] == saved and r["fingerprint"] == reference
