"""Nothing outlives the kernel: graceful shutdown, kernel restart and SIGKILL each leave
zero engine, nanny and controller processes within 10 s."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

from jaxsys_kernel import contract

from ..harness import Kernel, new_tag, tagged_processes, wait_no_processes

START = "%jaxsys start --hosts 2 --devices-per-host 1"


def _cluster_pids(tag: str, kernel_pid: int) -> set[int]:
    return {p.pid for p in tagged_processes(tag) if p.pid != kernel_pid}


@pytest.fixture
def fresh_tag():
    tag = new_tag()
    yield tag
    left = wait_no_processes(tag, timeout=10)
    for line in left:  # never leave a mess for the next test, even when this one failed
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, left


def _started_kernel(tag: str) -> Kernel:
    k = Kernel(tag)
    try:
        out = k.execute(START, timeout=120)
        assert out.status == "ok", out.stderr
        # the controller (+ its schedulers) and 2 engines
        assert len(_cluster_pids(tag, k.pid)) >= 3
    except BaseException:
        k.shutdown()
        raise
    return k


def test_graceful_shutdown_leaves_nothing(fresh_tag):
    k = _started_kernel(fresh_tag)
    t0 = time.monotonic()
    k.kc.stop_channels()
    k.km.shutdown_kernel(now=False)
    took = time.monotonic() - t0
    assert not wait_no_processes(fresh_tag, timeout=10)
    # jupyter_client would SIGKILL a kernel that took longer than 2.5 s; ours is faster.
    assert took < 2.5 + 1.0


def test_kernel_restart_leaves_nothing_of_the_old_cluster(fresh_tag):
    k = _started_kernel(fresh_tag)
    old = _cluster_pids(fresh_tag, k.pid)
    k.km.restart_kernel(now=False)
    k.kc.wait_for_ready(timeout=60)
    deadline = time.monotonic() + 10
    while old & {p.pid for p in tagged_processes(fresh_tag)} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not old & {p.pid for p in tagged_processes(fresh_tag)}
    # The restarted kernel works and can start a new cluster.
    out = k.execute(START, timeout=120)
    assert out.status == "ok", out.stderr
    k.shutdown()


def _profiles_of(pid: int) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"{contract.PROFILE_PREFIX}{pid}-*"))


def test_sigkill_of_the_kernel_leaves_nothing(fresh_tag):
    k = _started_kernel(fresh_tag)
    # The cluster's keys live in its profile: it must not stay behind on the node either.
    assert _profiles_of(k.pid)
    os.kill(k.pid, signal.SIGKILL)
    k.kc.stop_channels()
    assert not wait_no_processes(fresh_tag, timeout=10)
    k.km.cleanup_resources()
    deadline = time.monotonic() + 10
    while _profiles_of(k.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _profiles_of(k.pid)


def test_stop_magic_leaves_nothing(fresh_tag):
    k = _started_kernel(fresh_tag)
    out = k.execute("%jaxsys stop")
    assert out.status == "ok" and "cluster stopped in" in out.stdout
    deadline = time.monotonic() + 10
    while _cluster_pids(fresh_tag, k.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _cluster_pids(fresh_tag, k.pid)
    out = k.execute("%jaxsys status")
    assert out.status == "error" and "no cluster is running" in out.error["evalue"]
    k.shutdown()


def test_first_multihost_cell_starts_the_default_cluster(fresh_tag):
    k = Kernel(fresh_tag, spec_env={"JAXSYS_HOSTS": "2", "JAXSYS_DEVICES_PER_HOST": "1"})
    try:
        out = k.execute(
            "%%multihost\nimport jax\nprint(jax.process_count(), jax.device_count())", timeout=120
        )
        assert out.status == "ok", out.stderr
        assert out.stdout.endswith("[p0-1] 2 2\n")
        # Progress bars are display outputs updated in place (one output per bar when saved).
        progress = out.progress
        assert "engines registered 2/2" in progress and "processes initialised 2/2" in progress
        assert " ready in " in out.stdout and out.stderr == "", out.stderr
    finally:
        k.shutdown()


def test_bad_kernelspec_default_is_a_clear_error(fresh_tag):
    k = Kernel(fresh_tag, spec_env={"JAXSYS_HOSTS": "four"})
    try:
        out = k.execute("%%multihost\n1")
        assert out.status == "error"
        assert out.error["ename"] == "UsageError" and "$JAXSYS_HOSTS='four'" in out.error["evalue"]
    finally:
        k.shutdown()
