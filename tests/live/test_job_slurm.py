"""``jaxsys job --launcher slurm --submit`` under a private Slurm of three namespace hosts
(tests/slurm.py): the quickstart notebook as one batch job, its collated output the same
as the same job run locally, and a failing cell that stops every process and names itself.

The two logs are compared after :func:`normalise`, which replaces what legitimately
differs from one run to another: host names (this machine's, and the Slurm nodes'
``hostN``) and process ids. The quickstart prints neither today, so the comparison is in
effect exact; the normalisation keeps it meaningful if a cell starts printing them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxsys_kernel import cli

from .. import slurm

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = "notebooks/00-quickstart.ipynb"


@pytest.fixture(scope="module")
def hosts(tag):
    reason = slurm.available()
    if reason:
        pytest.skip(f"no private Slurm here: {reason}")
    with slurm.SlurmHosts(3) as s:
        yield s


def normalise(log: str, node_names: list[str]) -> str:
    """The log with host names as ``<host>`` and process ids as ``<pid>``."""
    names = sorted({socket.gethostname(), *node_names}, key=len, reverse=True)
    log = re.sub(r"\b(" + "|".join(map(re.escape, names)) + r")\b", "<host>", log)
    return re.sub(r"\b(pid|process id) \d+", r"\1 <pid>", log)


def _job(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jaxsys_kernel.cli", "job", *args, "--submit"],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def test_the_quickstart_under_slurm_collates_as_it_does_locally(hosts, tmp_path):
    local = _job(QUICKSTART, "--out", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr + local.stdout
    # Four processes on three nodes: JAX's coordinator on the first node, found from
    # Slurm's environment, is reached from the other hosts.
    under = _job(
        QUICKSTART, "--launcher", "slurm", "--sbatch-arg=--nodes=3", "--out", str(tmp_path / "s")
    )
    assert under.returncode == 0, f"{under.stderr}{under.stdout}\n{hosts.log_tail()}"
    assert "#SBATCH --nodes=3" in (tmp_path / "s" / "job.sbatch").read_text()
    want = normalise((tmp_path / "local" / "job.log").read_text(), hosts.node_names)
    got = normalise((tmp_path / "s" / "job.log").read_text(), hosts.node_names)
    assert "[p0-3] sum: 48.0 mean: 1.5\n" in want  # the local run did run the notebook
    assert got == want
    hosts.wait_queue_empty()


def test_a_failing_cell_under_slurm_exits_non_zero_and_names_it(hosts, tmp_path):
    cells = [
        "%jaxsys start --hosts 2 --devices-per-host 1",
        "%%multihost\nimport jax, numpy as np\nfrom jax.experimental import multihost_utils",
        "%%multihost\nif jax.process_index() == 1:\n    raise ValueError('p1 fails')\n"
        "multihost_utils.process_allgather(np.ones(3))",
        "%%multihost\nprint('never')",
    ]
    nb = {
        "cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": []} for c in cells],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path = tmp_path / "fails.ipynb"
    path.write_text(json.dumps(nb))
    t0 = time.monotonic()
    r = _job(
        str(path), "--launcher", "slurm", "--sbatch-arg=--nodes=2", "--out", str(tmp_path / "out")
    )
    took = time.monotonic() - t0
    assert r.returncode != 0
    assert "jaxsys job: cell 2 failed on p1" in r.stderr
    log = (tmp_path / "out" / "job.log").read_text()
    assert "--- cell 2 (failed on p1) ---\n" in log and "[p1] ValueError: p1 fails\n" in log
    assert "never" not in log
    # Slurm stopped p0, which waited in the collective, at once: its step daemon's word on
    # that is no output of the notebook's.
    assert "slurmstepd" not in log and "SIGTERM" not in log, log
    assert took < 60
    hosts.wait_queue_empty()


def _nb(folder: Path, name: str, *cells: str) -> Path:
    nb = {
        "cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": []} for c in cells],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path = folder / name
    path.write_text(json.dumps(nb))
    return path


def test_a_slurm_jobs_script_names_no_path_and_runs_none(tmp_path):
    # A notebook named with a space, in a folder whose name is a command substitution.
    folder = tmp_path / "$(touch PWNED) my nb"
    folder.mkdir()
    path = _nb(folder, "my notebook.ipynb", "%%multihost\nprint(1)")
    assert cli.main(["job", str(path), "--launcher", "slurm", "--hosts", "2"]) == 0
    # (no Slurm needed: the script runs here with a stand-in for srun)
    out = folder / "my notebook-job"
    script = (out / "job.sbatch").read_text()
    assert str(tmp_path) not in script
    (name,) = re.findall(r"^#SBATCH --job-name=(\S+)$", script, re.M)[-1:]
    assert re.fullmatch(r"jaxsys-job-my-notebook-job-[0-9a-f]{8}", name)
    # Run the script as sbatch would, with an srun that says what it was given.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done > srun.args\n')
    (fake / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    subprocess.run(["sh", "job.sbatch"], cwd=out, env=env, check=True, timeout=30)
    args = (out / "srun.args").read_text().splitlines()
    assert args[-1] == "program.py" and "--output=./p%t.out" in args
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()


def test_a_notebook_named_with_a_space_runs_under_slurm_and_its_timeout_cancels_the_job(
    hosts, tmp_path
):
    # In a folder whose name is a command substitution, which must not run.
    folder = tmp_path / "$(touch PWNED) my nb"
    folder.mkdir()
    start = "%jaxsys start --hosts 2 --devices-per-host 1"
    ran = _nb(folder, "my notebook.ipynb", start, "%%multihost\nimport jax\nprint('hi')")
    r = _job(str(ran), "--launcher", "slurm", "--sbatch-arg=--nodes=2")
    assert r.returncode == 0, f"{r.stderr}{r.stdout}\n{hosts.log_tail()}"
    log = (folder / "my notebook-job" / "job.log").read_text()
    assert log == "--- cell 1 ---\n[p0-1] hi\njaxsys job: ended: finished: 1 cells on 2 processes\n"
    assert not list(tmp_path.rglob("PWNED")) and not (REPO / "PWNED").exists()
    hosts.wait_queue_empty()
    # The job's time is up while its processes sleep: the Slurm job is cancelled, not left
    # holding its nodes until its time limit.
    sleeps = _nb(folder, "sleeps.ipynb", start, "%%multihost\nimport time\ntime.sleep(600)")
    r = _job(str(sleeps), "--launcher", "slurm", "--timeout", "20")
    assert r.returncode == 124, r.stderr
    log = (folder / "sleeps-job" / "job.log").read_text()
    (last,) = log.splitlines()[-1:]
    assert last.startswith("jaxsys job: ended: timeout after 20 s; its job cancelled"), log
    hosts.wait_queue_empty()
    assert not [pid for pid in hosts.namespace_pids() if _runs_program(pid)]


def _runs_program(pid: int) -> bool:
    try:
        return b"program.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
