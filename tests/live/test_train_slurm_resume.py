"""The example language model as a ``jaxsys job`` on the suite's private Slurm (tests/slurm.py):
preempted by Slurm, submitted again, it resumes from its checkpoint and ends bitwise equal to
an undisturbed run.

Two processes on two nodes train 8 steps, a checkpoint every 4. While a file ``hold`` is in
the job's folder, the processes wait after step 6, so the signal lands mid-run whatever the
machine's load. Once the step-4 checkpoint is complete on disk, ``scancel --signal=TERM``
sends SIGTERM to the job's step, as Slurm does to a job it preempts or whose time is nearly
up (``sbatch --signal``); with ``jaxsys job --preemption kill`` the processes end at once and
the job with them. The same job submitted
again (without ``hold``) resumes from its latest complete checkpoint, not from step 0, and
its final state has the fingerprint of the same notebook run undisturbed by the local
launcher meanwhile.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .. import slurm
from ..jobs import finish, printed_results

REPO = Path(__file__).resolve().parents[2]
STEPS, EVERY, HOLD = 8, 4, 6
START = "%jaxsys start --hosts 2 --devices-per-host 1"
# In the job's folder (the processes' working directory): the checkpoints in ckpt/.
TRAIN = f"""%%multihost
import json, os, time, jax
from jaxsys_kernel.examples import train
def _hold(step):
    deadline = time.monotonic() + 120
    while step == {HOLD} and os.path.exists("hold") and time.monotonic() < deadline:
        time.sleep(0.05)
r = train.train({STEPS}, "ckpt", every={EVERY}, log_every=1, after_step=_hold)
print("RESULT", jax.process_index(), json.dumps({{k: r[k] for k in ("step", "start", "fingerprint")}}))
"""
DEADLINE = 120.0


@pytest.fixture(scope="module")
def hosts(tag):
    reason = slurm.available()
    if reason:
        pytest.skip(f"no private Slurm here: {reason}")
    with slurm.SlurmHosts(2) as s:
        yield s


def _notebook(path: Path) -> Path:
    cells = [
        {"cell_type": "code", "source": c, "metadata": {}, "outputs": []} for c in (START, TRAIN)
    ]
    path.write_text(
        json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    )
    return path


def _job_argv(nb: Path, out: Path, *launcher: str) -> list[str]:
    # SIGTERM ends the processes (by default it is JAX's preemption notice: see
    # test_job_preemption_slurm.py).
    launcher = launcher or ("--launcher", "slurm", "--sbatch-arg=--nodes=2", "--preemption=kill")
    job = [sys.executable, "-m", "jaxsys_kernel.cli", "job", str(nb), *launcher]
    return [*job, "--out", str(out), "--submit"]


def _start(nb: Path, out: Path, *launcher: str) -> subprocess.Popen:
    argv = _job_argv(nb, out, *launcher)
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
    )


def _end(job: subprocess.Popen) -> tuple[int, str]:
    return finish(job, DEADLINE)


def _wait_for(ready, what: str, hosts) -> None:
    deadline = time.monotonic() + DEADLINE
    while not ready():
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE:g} s\n{hosts.log_tail()}"
        time.sleep(0.05)


def test_a_job_preempted_by_slurm_resumes_when_submitted_again_and_ends_bitwise_equal(
    hosts, tmp_path
):
    nb = _notebook(tmp_path / "train.ipynb")
    out = tmp_path / "preempted"
    out.mkdir()
    (out / "hold").touch()
    job = _start(nb, out)
    reference = _start(nb, tmp_path / "reference", "--launcher", "local")
    try:
        # Orbax writes a step in a temporary folder and renames it when complete.
        _wait_for(lambda: (out / "ckpt" / str(EVERY)).is_dir(), "step-4 checkpoint", hosts)
        (line,) = hosts.queue()
        subprocess.run(["scancel", "--signal=TERM", line.split()[0]], check=True, timeout=30)
        rc, said = _end(job)
    finally:
        ref_rc, ref_said = _end(reference)
    assert ref_rc == 0, ref_said
    want = printed_results((tmp_path / "reference" / "job.log").read_text())
    assert sorted(want) == [0, 1] and want[0]["start"] == 0, want
    assert rc != 0, said
    log = (out / "job.log").read_text()
    assert "RESULT" not in log, log  # it did not finish
    done = max(int(m[1]) for m in re.finditer(r"step (\d+) loss", log))
    assert EVERY <= done <= HOLD, log
    hosts.wait_queue_empty()

    (out / "hold").unlink()
    rc, said = _end(_start(nb, out))
    assert rc == 0, f"{said}\n{hosts.log_tail()}"
    log = (out / "job.log").read_text()
    resumed = printed_results(log)
    assert sorted(resumed) == [0, 1], log
    for r in resumed.values():
        assert EVERY <= r["start"] <= done and r["step"] == STEPS, resumed  # resumed, not redone
        assert r["fingerprint"] == want[0]["fingerprint"]
    assert f"restored step {resumed[0]['start']}" in log
    hosts.wait_queue_empty()
    assert not [pid for pid in hosts.namespace_pids() if _runs_program(pid)]


def _runs_program(pid: int) -> bool:
    try:
        return b"program.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
