"""Slurm's SIGTERM to a ``jaxsys job`` is a preemption notice: the job saves one step and ends.

The suite's private Slurm (tests/slurm.py), two processes on two nodes, the notebook of
``test_job_preemption_live``: each process waits after step 5 until JAX's coordination
service holds a preemption notice. ``scancel --signal=TERM`` sends SIGTERM to the job's
step, as Slurm does before it preempts a job or when its time is nearly up (``sbatch
--signal=TERM@N``): both processes must save the same step at JAX's sync point and the job
end with exit code 0. Submitted again, it resumes from that step and ends bitwise equal to
the same notebook run undisturbed by the local launcher.
"""

from __future__ import annotations

import subprocess

import pytest

from .. import slurm
from ..jobs import printed_results
from .test_job_preemption_live import (
    EVERY,
    HOLD,
    START,
    STEPS,
    TRAIN,
    _end,
    _notebook,
    _start,
    _steps,
    _wait_for,
)

SLURM = ("--launcher", "slurm", "--sbatch-arg=--nodes=2")


@pytest.fixture(scope="module")
def hosts(tag):
    reason = slurm.available()
    if reason:
        pytest.skip(f"no private Slurm here: {reason}")
    with slurm.SlurmHosts(2) as s:
        yield s


def test_slurms_sigterm_saves_the_same_step_on_every_process_then_it_resumes(hosts, tmp_path):
    nb = _notebook(tmp_path / "train.ipynb", START, TRAIN)
    out = tmp_path / "preempted"
    out.mkdir()
    (out / "hold").touch()
    job = _start(nb, out, *SLURM)
    reference = _start(nb, tmp_path / "reference")
    try:
        held = [out / f"held.{r}" for r in (0, 1)]
        _wait_for(lambda: all(p.exists() for p in held), "process held", job)
        (line,) = hosts.queue()
        subprocess.run(["scancel", "--signal=TERM", line.split()[0]], check=True, timeout=30)
        rc, said = _end(job)
    finally:
        ref_rc, ref_said = _end(reference)
    assert ref_rc == 0, ref_said
    want = printed_results((tmp_path / "reference" / "job.log").read_text())
    assert sorted(want) == [0, 1] and want[0]["step"] == STEPS, want

    assert rc == 0, f"{said}\n{hosts.log_tail()}"
    got = printed_results((out / "job.log").read_text())
    assert sorted(got) == [0, 1] and all(r["preempted"] for r in got.values()), got
    (step,) = {r["step"] for r in got.values()}
    assert HOLD < step < STEPS and _steps(out / "ckpt")[-1] == step, got
    assert EVERY in _steps(out / "ckpt")
    hosts.wait_queue_empty()

    (out / "hold").unlink()
    rc, said = _end(_start(nb, out, *SLURM))
    assert rc == 0, f"{said}\n{hosts.log_tail()}"
    resumed = printed_results((out / "job.log").read_text())
    assert sorted(resumed) == [0, 1], said
    for r in resumed.values():
        assert r["start"] == step and r["step"] == STEPS, resumed
        assert r["fingerprint"] == want[0]["fingerprint"]
    hosts.wait_queue_empty()
    assert not [pid for pid in hosts.namespace_pids() if _runs_program(pid)]


def _runs_program(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"program.py" in f.read()
    except OSError:
        return False
