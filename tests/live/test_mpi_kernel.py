"""An MPI cluster driven from a real jaxsys kernel, as a user drives it: started with
``%jaxsys start --launcher mpi``, its processes the ranks of one ``mpiexec`` job, mTLS on,
the hang doctor's stacks, a single-process restart refused in words, and nothing left after
``%jaxsys stop`` or after the kernel is killed."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import time

import pytest

from ..certs import CERT_CELL, assert_one_certificate_per_process
from ..harness import Kernel, new_tag, status_table, tagged_processes, wait_no_processes

START = "%jaxsys start --launcher mpi --hosts 2 --devices-per-host 1 --env JAX_PLATFORMS=cpu"
RANKS_CELL = (
    "%%multihost\nimport os, jax\n"
    "print(jax.process_index(), 'is MPI rank', os.environ['OMPI_COMM_WORLD_RANK'])"
)
# Seconds allowed from a stop (or a death) to no process of the job left.
DRAIN_S = 15.0


@pytest.fixture(scope="module")
def mpi():
    if shutil.which("mpiexec") is None:
        pytest.skip("mpiexec not found: apt-get install openmpi-bin")
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py not installed: pip install 'jaxsys[mpi]'")


def _started(tag: str) -> Kernel:
    k = Kernel(tag)
    out = k.execute(START, timeout=180)
    assert out.status == "ok", f"{(out.error or {}).get('evalue')}\n{out.stderr}"
    return k


def _left_beside(k: Kernel, tag: str) -> list[str]:
    """The job's processes still running after a stop (the kernel aside), once
    :data:`DRAIN_S` has passed or none is left."""
    deadline = time.monotonic() + DRAIN_S
    while True:
        left = [p for p in tagged_processes(tag) if p.pid != k.pid]
        if not left or time.monotonic() > deadline:
            return [str(p.pid) for p in left]
        time.sleep(0.1)


def test_an_mpi_cluster_from_the_kernel(mpi):
    tag = new_tag()
    k = _started(tag)
    try:
        assert k.ok(RANKS_CELL).stdout == "[p0] 0 is MPI rank 0\n[p1] 1 is MPI rank 1\n"
        status = k.ok("%jaxsys status").stdout
        assert [row["state"] for row in status_table(status).values()] == ["ready"] * 2, status
        assert re.search(r"^security: .*mTLS", status, re.M), status
        assert_one_certificate_per_process(k.ok("%%multihost" + CERT_CELL).stdout, 2)
        assert "standby: none" in status, status
        out = k.execute("%%multihost --timeout 1.5\nimport time\ntime.sleep(30)", timeout=60)
        assert out.status == "error" and out.error["ename"] == "MultihostTimeout", out.error
        assert ">> " in out.stderr and "time.sleep(30)" in out.stderr, out.stderr
        out = k.execute("%jaxsys restart 1")
        assert out.status == "error"
        assert "the mpi launcher cannot restart a single process" in out.error["evalue"]
        assert "restart the whole world" in out.error["evalue"]
        k.ok("%jaxsys stop")
        assert not _left_beside(k, tag), _left_beside(k, tag)
    finally:
        k.shutdown()
    assert not wait_no_processes(tag, timeout=DRAIN_S)


def test_killing_the_kernel_ends_the_mpi_job(mpi):
    tag = new_tag()
    k = _started(tag)
    assert len(tagged_processes(tag)) > 3  # mpiexec, the engines, the controller, the kernel
    os.kill(k.pid, signal.SIGKILL)
    k.kc.stop_channels()
    try:
        assert not wait_no_processes(tag, timeout=DRAIN_S)
    finally:
        k.km.cleanup_resources()
