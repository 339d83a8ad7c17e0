"""The Slurm watchdog with Slurm's commands replaced: a failing squeue is no proof that the
job left the queue, a missing one does not end the watchdog, a scancel that gets no answer
is tried again, and the owner is named by pid and start time."""

from __future__ import annotations

import os
import subprocess

import pytest

from jaxsys_kernel.cluster import slurm_watch


@pytest.fixture
def slurm(monkeypatch):
    """Slurm commands answered from ``answers[command]`` (a list, first answer first; the
    last one repeats); every call is recorded in ``calls``."""
    answers: dict[str, list] = {}
    calls: list[list[str]] = []

    def run(argv, **kwargs):
        calls.append(argv)
        queue = answers[argv[0]]
        rc, out, err = queue.pop(0) if len(queue) > 1 else queue[0]
        return subprocess.CompletedProcess(argv, rc, out, err)

    monkeypatch.setattr(slurm_watch.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(slurm_watch.subprocess, "run", run)
    monkeypatch.setattr(slurm_watch, "BACKOFF_FIRST_S", 0.01)
    monkeypatch.setattr(slurm_watch, "BACKOFF_MAX_S", 0.02)
    monkeypatch.setattr(slurm_watch, "WATCH_PID_S", 0.001)
    monkeypatch.setattr(slurm_watch, "WATCH_QUEUE_S", 0.001)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return answers, calls


DOWN = (1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)")


def test_only_an_answer_says_the_job_left_the_queue(slurm, monkeypatch):
    answers, _ = slurm
    answers["squeue"] = [DOWN]
    assert slurm_watch.job_queued("12") is None
    answers["squeue"] = [(0, "RUNNING\n", "")]
    assert slurm_watch.job_queued("12") is True
    answers["squeue"] = [(0, "", "")]
    assert slurm_watch.job_queued("12") is False
    answers["squeue"] = [(1, "", "slurm_load_jobs error: Invalid job id specified")]
    assert slurm_watch.job_queued("12") is False
    monkeypatch.setattr(slurm_watch.shutil, "which", lambda name: None)
    assert slurm_watch.job_queued("12") is None  # squeue missing: no answer either


def test_the_watchdog_outlasts_a_controller_that_does_not_answer(slurm, tmp_path):
    answers, calls = slurm
    # Three failing squeues, then an answer that the job is gone.
    answers["squeue"] = [DOWN, DOWN, DOWN, (0, "", "")]
    me = os.getpid()
    log = slurm_watch.Log(tmp_path / "w.log")
    assert slurm_watch.watch("12", me, slurm_watch.process_start(me), log) == 0
    assert [c[0] for c in calls] == ["squeue"] * 4  # nothing cancelled: the owner lives
    assert "squeue got no answer about job 12" in (tmp_path / "w.log").read_text()


def _no_such_pid() -> int:
    return next(p for p in range(4_000_000, 3_000_000, -1) if not os.path.exists(f"/proc/{p}"))


def test_a_dead_owner_gets_its_job_cancelled_once_slurmctld_answers(slurm, tmp_path):
    answers, calls = slurm
    down = (1, "", "scancel: error: Unable to contact slurm controller (connect failure)")
    answers["scancel"] = [down, down, (0, "", "")]
    log = slurm_watch.Log(tmp_path / "w.log")
    assert slurm_watch.watch("12", _no_such_pid(), None, log) == 0
    kills = [c for c in calls if c[0] == "scancel"]
    # Each failed try stops at the first scancel; the third try sends both.
    assert kills[-2:] == [["scancel", "--full", "-s", "KILL", "12"], ["scancel", "12"]]
    assert len(kills) == 4
    text = (tmp_path / "w.log").read_text()
    assert "scancel 12 got no answer from slurmctld" in text and "job 12 cancelled" in text


def test_a_reused_pid_is_not_the_owner():
    me = os.getpid()
    start = slurm_watch.process_start(me)
    assert slurm_watch.alive(me, start)
    assert not slurm_watch.alive(me, start - 1)  # same pid, another process
    assert not slurm_watch.alive(_no_such_pid(), None)


def test_the_watchdog_ends_when_its_slurm_is_gone(slurm, monkeypatch, tmp_path):
    answers, _ = slurm
    answers["squeue"] = [DOWN]
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    log = slurm_watch.Log(tmp_path / "w.log")
    assert slurm_watch.watch("12", os.getpid(), None, log) == 1
    assert "is gone: job 12 is no longer watched" in (tmp_path / "w.log").read_text()


def test_a_clean_watch_leaves_no_log(tmp_path):
    log = slurm_watch.Log(tmp_path / "w.log")
    log("watching")
    log.done()
    assert not (tmp_path / "w.log").exists()
    log("squeue failed", failure=True)
    log.done()
    assert (tmp_path / "w.log").stat().st_mode & 0o777 == 0o600
