"""`jaxsys job --submit` for real: the quickstart notebook as one job of four local
processes, each joined with mTLS and the compilation cache a notebook's cluster has, its
output collated as the notebook shows it, and a failing cell that stops every process and
names itself."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from jaxsys_kernel.cluster import ClusterConfig

REPO = Path(__file__).resolve().parents[2]


def _job(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jaxsys_kernel.cli", "job", *args, "--submit"],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def test_the_quickstart_runs_as_a_job(tmp_path):
    r = _job("notebooks/00-quickstart.ipynb", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr + r.stdout
    log = (tmp_path / "job.log").read_text()
    assert log in r.stdout
    for expected in (
        "--- cell 6 ---\n[p0] I am process 0 of 4\n",
        "[p0-3] local devices: 2, devices in the world: 8\n",
        "[p0-3] sum: 48.0 mean: 1.5\n",
        "--- cell 20 ---\n[p0] only process 0 ran this",
        "--- cell 22 (failed on p1,3, as expected) ---\n",
        "[p1,3] ZeroDivisionError: division by zero\n",
        "[p0] 0\n[p1] 10\n[p2] 20\n[p3] 30\n",
    ):
        assert expected in log, log
    assert "program.py" not in log  # tracebacks start at the cell's own frames
    assert "Gloo" not in log
    # Each process joined with its own certificate, refusing an insecure channel, and used
    # the cache directory a notebook's cluster would (what it says before its first cell).
    cache = ClusterConfig().cache_dir
    for rank in range(4):
        said = (tmp_path / f"p{rank}.out").read_text()
        assert (
            f"jaxsys job: process {rank} of 4: jax_mtls_cert_file={tmp_path}/pki/process-{rank}.pem "
            f"jax_distributed_verify_secure_credentials=True jax_compilation_cache_dir={cache} "
            "jax_enable_recoverability=True"
        ) in said, said
    assert "jaxsys job: process" not in log


def test_a_failing_cell_stops_every_process_and_is_named(tmp_path):
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
    r = _job(str(path), "--out", str(tmp_path / "out"), timeout=120)
    took = time.monotonic() - t0
    assert r.returncode != 0
    assert "jaxsys job: cell 2 failed on p1" in r.stderr
    log = (tmp_path / "out" / "job.log").read_text()
    assert "--- cell 2 (failed on p1) ---" in log and "[p1] ValueError: p1 fails" in log
    assert "never" not in log
    # p0 waited in the collective for p1 and was stopped, not left hanging.
    assert took < 60
