"""``jaxsys job --retries``: a job whose process died runs again and resumes from its
checkpoint; submitted again later, it resumes instead of starting at step 0.

Local launcher, 2 x 1 processes, the example language model: process 1 kills itself once,
after step 6 of 8 (a file in the job's folder says it already did), with checkpoints every
4 steps in ``ckpt/`` inside the job's folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ..jobs import printed_results

REPO = Path(__file__).resolve().parents[2]
START = "%jaxsys start --hosts 2 --devices-per-host 1"
TRAIN = """%%multihost
import json, os, signal, jax
from jaxsys_kernel.examples import train
def _die_once(step):
    if step == 6 and jax.process_index() == 1 and not os.path.exists("died-once"):
        open("died-once", "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
r = train.train(8, "ckpt", every=4, log_every=0, after_step=_die_once)
print("RESULT", jax.process_index(), json.dumps({k: r[k] for k in ("step", "start", "fingerprint")}))
"""


def _notebook(path: Path, *cells: str) -> Path:
    nb = {
        "cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": []} for c in cells],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))
    return path


def _job(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jaxsys_kernel.cli", "job", *args, "--submit"],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=REPO,
    )


def test_a_failed_job_is_run_again_and_resumes_then_a_resubmission_resumes(tmp_path):
    nb = _notebook(tmp_path / "train.ipynb", START, TRAIN)
    out = tmp_path / "out"
    r = _job(str(nb), "--launcher", "local", "--out", str(out), "--retries", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    # p1's death ends the first run, named as p1's death or as p0's failed collective.
    assert "jaxsys job: run 1 ended after" in r.stderr and "in cell 1" not in r.stdout, r.stderr
    assert "retry 1 of 1" in r.stderr and "ended ok on retry 1 of 1" in r.stderr, r.stderr
    assert (out / "died-once").exists()
    ended = (out / "job.1.log").read_text().splitlines()[-1]
    assert ended.startswith("jaxsys job: ended: ") and "cell 1" in ended, ended
    assert "finished" not in ended, ended
    first = printed_results((out / "job.log").read_text())
    assert sorted(first) == [0, 1], (out / "job.log").read_text()
    assert first[0]["fingerprint"] == first[1]["fingerprint"]
    # Resumed from a checkpoint the first run finished (Orbax also keeps its first step).
    assert all(0 < v["start"] <= 6 and v["step"] == 8 for v in first.values()), first

    # Submitted again (as after its scheduler ended it): it resumes at its last checkpoint.
    again = _job(str(nb), "--launcher", "local", "--out", str(out))
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = printed_results((out / "job.log").read_text())
    assert all(v["start"] == 8 for v in resumed.values()), resumed
    assert resumed[0]["fingerprint"] == first[0]["fingerprint"]


def test_retries_out_of_range_are_refused(tmp_path):
    nb = _notebook(tmp_path / "train.ipynb", START, "%%multihost\nprint(1)")
    r = _job(str(nb), "--launcher", "local", "--out", str(tmp_path / "out"), "--retries", "-2")
    assert r.returncode == 2 and "--retries must be a whole number from 0" in r.stderr, r.stderr
