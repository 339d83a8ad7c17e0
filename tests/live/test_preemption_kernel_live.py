"""SIGTERM to one process of a kernel-started cluster is a preemption notice, the JAX way.

A real kernel starts 2 x 1 processes; the example language model trains in a thread on each
(so the kernel is free to send the signal meanwhile); ``%jaxsys kill 1 --signal TERM`` must
return at once, and JAX's preemption sync point must have both processes save the same step
and return from training, alive.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from ..harness import kernel_with_cluster, process_states

STEPS = 40

START = """%%multihost
import json, threading, time, jax
from jaxsys_kernel.examples import train
done, progress = {{}}, {{"step": 0}}
def _slow(s):
    progress["step"] = s
    time.sleep(0.2)  # so that the notice lands long before the last step
worker = threading.Thread(target=lambda: done.update(
    train.train({steps}, {ckpt!r}, every=4, log_every=0, after_step=_slow)))
worker.start()
deadline = time.monotonic() + 120
while progress["step"] < 2 and worker.is_alive() and time.monotonic() < deadline:
    time.sleep(0.05)
print("at", progress["step"])
"""

JOIN = """%%multihost
worker.join(120)
r = {k: done.get(k) for k in ("step", "preempted", "fingerprint")}
print("RESULT", jax.process_index(), json.dumps(r))
"""


@pytest.fixture(scope="module")
def k(tag):
    with kernel_with_cluster(tag, "%jaxsys start --hosts 2 --devices-per-host 1") as kernel:
        yield kernel


def test_sigterm_to_one_process_saves_the_same_step_everywhere(k, tmp_path):
    ckpt = tmp_path / "ckpt"
    started = k.ok(START.format(steps=STEPS, ckpt=str(ckpt)), timeout=240)
    assert "at 2" in started.stdout or "at 3" in started.stdout, started.stdout

    t0 = time.monotonic()
    sent = k.ok("%jaxsys kill 1 --signal TERM")
    took = time.monotonic() - t0
    assert "sent SIGTERM to process 1" in sent.stdout, sent.stdout
    assert "preemption" in sent.stdout, sent.stdout
    assert took < 5, f"the kill waited {took:.1f} s for a process that must not exit"

    joined = k.ok(JOIN, timeout=180)
    found = {
        int(m[1]): json.loads(m[2]) for m in re.finditer(r"RESULT (\d+) (\{.*\})", joined.stdout)
    }
    assert sorted(found) == [0, 1], joined.stdout
    assert found[0] == found[1], found  # the same step and the same bits on both
    saved = found[0]["step"]
    assert found[0]["preempted"] and 2 <= saved < STEPS, found
    assert str(saved) in {p.name for p in ckpt.iterdir()}
    # Both processes returned from training and are alive: the notice stopped the program,
    # not the engines.
    states = process_states(k.ok("%jaxsys status").stdout)
    assert states == {0: "ready", 1: "ready"}, states
