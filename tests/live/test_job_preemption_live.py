"""SIGTERM to one process of a ``jaxsys job`` is a preemption notice, the JAX way.

Local launcher, 2 x 1 processes. The example language model trains 12 steps, a checkpoint
every 4; while a file ``hold`` is in the job's folder, each process waits after step 5 until
JAX's coordination service holds a preemption notice, so the signal lands mid-run whatever
the machine's load. SIGTERM to process 1 alone must make both save the same step at JAX's
sync point and the job end cleanly (exit code 0); the job submitted again resumes from that
step and ends bitwise equal to the same notebook run undisturbed. With a program that never
reaches a sync point, the notice's grace bounds the job; with ``--preemption kill`` SIGTERM
ends the process at once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxsys_kernel.job.owner import END_WAIT_S

from ..jobs import finish, printed_results

REPO = Path(__file__).resolve().parents[2]
STEPS, EVERY, HOLD = 12, 4, 5
START = "%jaxsys start --hosts 2 --devices-per-host 1"
# In the job's folder (the processes' working directory): the checkpoints in ckpt/.
TRAIN = f"""%%multihost
import json, os, time, jax
from jax._src import distributed
from jaxsys_kernel.examples import train
def _hold(step):
    if step != {HOLD} or not os.path.exists("hold"):
        return
    open(f"held.{{jax.process_index()}}", "w").close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:  # where JAX's preemption sync manager says it had a notice
            distributed.global_state.client.blocking_key_value_get(
                "RECEIVED_PREEMPTION_NOTICE", 200)
            return
        except Exception:
            pass
r = train.train({STEPS}, "ckpt", every={EVERY}, log_every=1, after_step=_hold)
print("RESULT", jax.process_index(), json.dumps(
    {{k: r[k] for k in ("step", "start", "preempted", "fingerprint")}}))
"""
# A cell that never reaches a preemption sync point.
WAIT = """%%multihost
import os, time, jax
open(f"held.{jax.process_index()}", "w").close()
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    time.sleep(0.05)
"""
DEADLINE = 240.0


def _notebook(path: Path, *cells: str) -> Path:
    nb = {
        "cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": []} for c in cells],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))
    return path


def _start(nb: Path, out: Path, *args: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "jaxsys_kernel.cli", "job", str(nb), "--launcher", "local"]
    return subprocess.Popen(
        [*argv, "--out", str(out), "--submit", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def _end(job: subprocess.Popen) -> tuple[int, str]:
    return finish(job, DEADLINE)


def _wait_for(ready, what: str, job: subprocess.Popen) -> None:
    deadline = time.monotonic() + DEADLINE
    while not ready():
        assert job.poll() is None, f"the job ended before {what}: {_end(job)[1]}"
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE:g} s"
        time.sleep(0.05)


def _programs(out: Path) -> dict[int, int]:
    """The job's processes (their rank: their pid), found by their working directory."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or proc.joinpath("cwd").resolve() != out.resolve():
                continue
            if b"program.py" not in proc.joinpath("cmdline").read_bytes():
                continue
            env = proc.joinpath("environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:  # the local launcher's rank variable, or Open MPI's
            if item.startswith((b"JAXSYS_PROCESS_ID=", b"OMPI_COMM_WORLD_RANK=")):
                found[int(item.split(b"=", 1)[1])] = int(proc.name)
    return found


def _hold_and_signal(nb: Path, out: Path, signum: int, *args: str) -> tuple[int, str, float]:
    """Run the job until both processes are held, SIGTERM process 1; its code, output, and
    seconds from the signal to the job's end."""
    out.mkdir()
    (out / "hold").touch()
    job = _start(nb, out, *args)
    held = [out / f"held.{r}" for r in (0, 1)]
    _wait_for(lambda: all(p.exists() for p in held), "process held", job)
    pid = _programs(out)[1]
    t0 = time.monotonic()
    os.kill(pid, signum)
    rc, said = _end(job)
    return rc, said, time.monotonic() - t0


def _steps(ckpt: Path) -> list[int]:
    """The steps Orbax finished writing (a step is renamed to its number when complete)."""
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())


def test_sigterm_to_one_process_saves_the_same_step_everywhere_then_it_resumes(tmp_path):
    nb = _notebook(tmp_path / "train.ipynb", START, TRAIN)
    out = tmp_path / "preempted"
    reference = _start(nb, tmp_path / "reference")
    try:
        rc, said, _ = _hold_and_signal(nb, out, signal.SIGTERM)
    finally:
        ref_rc, ref_said = _end(reference)
    assert ref_rc == 0, ref_said
    want = printed_results((tmp_path / "reference" / "job.log").read_text())
    assert sorted(want) == [0, 1] and want[0]["step"] == STEPS, want

    assert rc == 0, said
    log = (out / "job.log").read_text()
    assert log.rstrip().endswith("ended: finished: 1 cells on 2 processes"), log
    got = printed_results(log)
    assert sorted(got) == [0, 1], log
    saved = {r["step"] for r in got.values()}
    assert len(saved) == 1 and all(r["preempted"] for r in got.values()), got
    (step,) = saved
    assert HOLD < step < STEPS, got
    assert re.search(rf"\[p0-1\] preempted: saved step {step}\n", log), log
    # The last step saved is the sync point's, after the periodic ones.
    steps = _steps(out / "ckpt")
    assert steps[-1] == step and EVERY in steps, steps
    # Each process wrote its own shards of the sharded state at that step.
    wrote = sorted(p.name for p in (out / "ckpt" / str(step) / "state").glob("ocdbt.process_*"))
    assert wrote == ["ocdbt.process_0", "ocdbt.process_1"], wrote
    assert not _programs(out)

    (out / "hold").unlink()
    rc, said = _end(_start(nb, out))
    assert rc == 0, said
    log = (out / "job.log").read_text()
    resumed = printed_results(log)
    assert sorted(resumed) == [0, 1], log
    for r in resumed.values():
        assert r["start"] == step and r["step"] == STEPS, resumed
        assert r["fingerprint"] == want[0]["fingerprint"]
    assert f"restored step {step}" in log
    assert not _programs(out)


def test_a_notice_that_no_sync_point_takes_ends_the_job_after_its_grace(tmp_path):
    nb = _notebook(tmp_path / "wait.ipynb", START, WAIT)
    out = tmp_path / "out"
    rc, said, took = _hold_and_signal(nb, out, signal.SIGTERM, "--preemption-grace", "2")
    assert rc == 128 + signal.SIGTERM, said
    log = (out / "job.log").read_text()
    assert "not ended 2 s after a preemption notice: it ends now" in log, log
    assert took < 30, f"the job took {took:.1f} s to end after the notice"
    assert not _programs(out)


def test_with_preemption_kill_sigterm_ends_the_process_at_once(tmp_path):
    nb = _notebook(tmp_path / "wait.ipynb", START, WAIT)
    out = tmp_path / "out"
    rc, said, took = _hold_and_signal(nb, out, signal.SIGTERM, "--preemption", "kill")
    assert rc == 128 + signal.SIGTERM, said
    log = (out / "job.log").read_text()
    assert log.rstrip().endswith("ended: p1 died of SIGTERM in cell 1"), log
    assert took < 30, f"the job took {took:.1f} s to end after SIGTERM"
    assert not _programs(out)


def test_a_bad_grace_is_refused(tmp_path):
    nb = _notebook(tmp_path / "wait.ipynb", START, WAIT)
    rc, said = _end(_start(nb, tmp_path / "out", "--preemption-grace", "0"))
    assert rc == 2 and "--preemption-grace must be a positive number of seconds" in said, said


def test_the_timeout_ends_an_mpiexec_jobs_ranks_that_take_sigterm_as_a_notice(tmp_path):
    # mpiexec's ranks are in the session that jaxsys job's own teardown signals: SIGTERM is
    # a notice to them, so the teardown must end them without it.
    if shutil.which("mpiexec") is None:
        pytest.skip("mpiexec not found: apt-get install openmpi-bin")
    nb = _notebook(tmp_path / "wait.ipynb", START, WAIT)
    out = tmp_path / "out"
    job = _start(nb, out, "--launcher", "mpi", "--timeout", "20")
    _wait_for(lambda: all((out / f"held.{r}").exists() for r in (0, 1)), "process held", job)
    assert sorted(_programs(out)) == [0, 1]
    t0 = time.monotonic()
    rc, said = _end(job)
    assert rc == 124, said
    assert time.monotonic() - t0 < 20 + END_WAIT_S, said
    assert (out / "job.log").read_text().rstrip().endswith("ended: timeout after 20 s")
    assert not _programs(out)
