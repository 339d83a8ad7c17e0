"""``jaxsys job --launcher kubernetes --submit`` against the hermetic test cluster: the
program runs as an Indexed Job's pods (JAX's own detection joins them) and the collated log
is the one a local job writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.k8s_kubelet import running

pytestmark = [pytest.mark.live, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
CELLS = [
    "%jaxsys start --hosts 2 --devices-per-host 1",
    "%%multihost\nimport jax, jax.numpy as jnp\n"
    "total = jax.pmap(lambda x: jax.lax.psum(x, 'i'), axis_name='i')("
    "jnp.array([jax.process_index() + 1.0]))\n"
    "print('process', jax.process_index(), 'of', jax.process_count(), 'sum', float(total[0]))",
]


def _notebook(path: Path, cells) -> Path:
    nb = {
        "cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": []} for c in cells],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))
    return path


def _job(*args: str, env=None) -> subprocess.CompletedProcess[str]:
    return _ended(_begin(*args, env=env))


def _begin(*args: str, env=None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "jaxsys_kernel.cli", "job", *args, "--submit"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )


def _ended(p: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    try:
        out, err = p.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.fixture
def k8s():
    with running() as cluster:
        yield cluster


def test_a_job_on_pods_collates_as_it_does_locally(k8s, tmp_path):
    nb = _notebook(tmp_path / "sum.ipynb", CELLS)
    env = {**os.environ, "KUBECONFIG": str(k8s.api.kubeconfig(tmp_path / "kubeconfig"))}
    out = tmp_path / "k8s"
    # The two jobs run side by side: each waits more than it computes.
    on_pods = _begin(
        str(nb), "--launcher", "kubernetes", "--image", "img", "--out", str(out), env=env
    )
    local = _job(str(nb), "--out", str(tmp_path / "local"))
    r = _ended(on_pods)
    assert local.returncode == 0, local.stderr + local.stdout
    assert r.returncode == 0, r.stderr + r.stdout
    want = (tmp_path / "local" / "job.log").read_text()
    assert "[p0] process 0 of 2 sum 3.0\n" in want
    assert (out / "job.log").read_text() == want
    # The world was made from the manifests left for the user, and deleted afterwards.
    assert "kind: Job" in (out / "world.yaml").read_text()
    assert k8s.api.list("Pod", "default") == [] and k8s.api.list("Job", "default") == []
    assert k8s.api.list("Secret", "default") == [] and k8s.api.list("Service", "default") == []


def test_a_job_stopped_by_its_timeout_deletes_its_world(k8s, tmp_path):
    nb = _notebook(
        tmp_path / "sleeps.ipynb",
        [CELLS[0], "%%multihost\nimport time\nprint('started', flush=True)\ntime.sleep(600)"],
    )
    env = {**os.environ, "KUBECONFIG": str(k8s.api.kubeconfig(tmp_path / "kubeconfig"))}
    out = tmp_path / "out"
    r = _job(
        str(nb),
        "--launcher",
        "kubernetes",
        "--image",
        "i",
        "--out",
        str(out),
        "--timeout",
        "6",
        env=env,
    )
    assert r.returncode != 0
    assert "deleting world" in r.stderr, r.stderr
    assert k8s.api.list("Job", "default") == [] and k8s.api.list("Pod", "default") == []
    assert not list(k8s.processes())


def test_a_failing_cell_on_pods_exits_non_zero_and_names_it(k8s, tmp_path):
    nb = _notebook(
        tmp_path / "fails.ipynb",
        [
            CELLS[0],
            "%%multihost\nimport jax, numpy as np\nfrom jax.experimental import multihost_utils",
            "%%multihost\nif jax.process_index() == 1:\n    raise ValueError('p1 fails')\n"
            "multihost_utils.process_allgather(np.ones(3))",
            "%%multihost\nprint('never')",
        ],
    )
    env = {**os.environ, "KUBECONFIG": str(k8s.api.kubeconfig(tmp_path / "kubeconfig"))}
    out = tmp_path / "out"
    r = _job(str(nb), "--launcher", "kubernetes", "--image", "i", "--out", str(out), env=env)
    assert r.returncode != 0
    assert "jaxsys job: cell 2 failed on p1" in r.stderr, r.stderr
    log = (out / "job.log").read_text()
    assert "[p1] ValueError: p1 fails\n" in log and "never" not in log
    assert k8s.api.list("Pod", "default") == [] and not list(k8s.processes())
