"""``%%multihost --retries``: a training cell survives the death of a process, bit for bit.

A real kernel starts 2 x 1 processes. An undisturbed cell trains the example language model
12 steps; the same cell with ``--retries 1`` has process 1 killed (SIGKILL) once step 6 is
done: jaxsys must restart the world, send the cell again, and the program, resuming from
its checkpoint, must end with the undisturbed run's fingerprint.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import pytest

from ..harness import kernel_with_cluster, status_table

STEPS, EVERY, KILL_AFTER = 12, 4, 6

# Self-contained: a retry runs it on new processes, where earlier cells' names are gone.
CELL = """%%multihost {options}
import json, os, time, jax
from jaxsys_kernel.examples import train
def _mark(s):
    if jax.process_index() == 0:
        open(os.path.join({marks!r}, str(s)), "w").close()
    time.sleep(0.3)  # so that the kill lands mid-run
r = train.train({steps}, {ckpt!r}, every={every}, log_every=0, after_step=_mark)
print("RESULT", jax.process_index(), json.dumps({{k: r[k] for k in ("step", "start", "fingerprint")}}))
"""


@pytest.fixture(scope="module")
def k(tag):
    with kernel_with_cluster(tag, "%jaxsys start --hosts 2 --devices-per-host 1") as kernel:
        yield kernel


def results(stdout: str) -> dict[int, dict]:
    found = {int(m[1]): json.loads(m[2]) for m in re.finditer(r"RESULT (\d+) (\{.*\})", stdout)}
    assert sorted(found) == [0, 1], stdout
    return found


def cell(tmp, name: str, options: str = "") -> str:
    marks = tmp / f"{name}-marks"
    marks.mkdir()
    return CELL.format(
        options=options,
        marks=str(marks),
        steps=STEPS,
        ckpt=str(tmp / f"{name}-ckpt"),
        every=EVERY,
    )


def _kill_after(marks: str, pid: int, step: int, killed: list) -> None:
    """SIGKILL ``pid`` once process 0 has finished ``step`` (bounded wait)."""
    deadline = time.monotonic() + 180
    while not os.path.exists(os.path.join(marks, str(step))):
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    killed.append(pid)


def test_a_killed_process_is_retried_and_ends_bitwise_equal(k, tmp_path):
    reference = results(k.ok(cell(tmp_path, "reference"), timeout=240).stdout)
    assert reference[0] == reference[1] and reference[0]["start"] == 0

    pid = int(status_table(k.ok("%jaxsys status").stdout)[1]["pid"])
    killed: list[int] = []
    killer = threading.Thread(
        target=_kill_after, args=(str(tmp_path / "retried-marks"), pid, KILL_AFTER, killed)
    )
    code = cell(tmp_path, "retried", "--retries 1 --grace 3")
    killer.start()
    try:
        out = k.ok(code, timeout=300)
    finally:
        killer.join()
    assert killed == [pid]
    assert "--retries: process 1 died" in out.stderr, out.stderr
    assert "world restarted in" in out.stderr and "retry 1 of 1" in out.stderr, out.stderr
    assert "ended ok on retry 1 of 1" in out.stderr, out.stderr
    got = results(out.stdout)
    for r in got.values():
        assert 0 < r["start"] <= KILL_AFTER and r["step"] == STEPS, got  # resumed, not redone
        assert r["fingerprint"] == reference[0]["fingerprint"]


def test_retries_out_of_range_are_refused(k):
    out = k.execute("%%multihost --retries -1\nprint(1)")
    assert out.status == "error" and "--retries must be a whole number" in out.stderr, out.stderr
