"""Restart and stop end each engine's process group: what a cell started goes with the
world, an engine that holds the GIL is gone before the new world is ready, and a pid that
now names another process is never signalled."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import time

import psutil
import pytest

from jaxsys_kernel import Cluster
from jaxsys_kernel.cluster.teardown import killpg_all, start_time

from .. import netns, sshd
from ..harness import new_tag, wait_no_processes

WAIT_S = 30.0


def _start_sleep():
    import os
    import subprocess

    child = subprocess.Popen(["sleep", "4321"])
    return {"engine": os.getpid(), "child": child.pid}


def _hold_the_gil(marker_dir):
    import os
    import pathlib
    import re

    pathlib.Path(marker_dir, str(os.getpid())).touch()
    # A catastrophic backtracking match: minutes inside the regex engine, which never
    # releases the GIL, so no other thread of this process runs.
    re.match("(a*)*b", "a" * 40)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while [pid for pid in pids if _alive(pid)]:
        left = [pid for pid in pids if _alive(pid)]
        assert time.monotonic() < deadline, f"{what} still running after {WAIT_S:g} s: {left}"
        time.sleep(0.05)


@pytest.fixture(params=[True, False], ids=["forked", "plain"])
def cluster(request, monkeypatch):
    tag = new_tag()
    monkeypatch.setenv("JAXSYS_TEST_RUN", tag)
    c = Cluster(
        hosts=2,
        devices_per_host=1,
        standby=0,
        fork_server=request.param,
        progress=lambda e: None,
    )
    c.start_sync()
    try:
        yield c
    finally:
        c.kill()
    assert not wait_no_processes(tag, timeout=15)


def test_what_cells_started_ends_with_restart_and_with_stop(cluster):
    first = cluster.world.view.apply_sync(_start_sleep)
    assert all(_alive(m["child"]) for m in first)
    cluster.restart_sync()
    _wait_gone([m["child"] for m in first], "children of the old world's engines")
    second = cluster.world.view.apply_sync(_start_sleep)
    assert all(_alive(m["child"]) for m in second)
    cluster.kill()
    _wait_gone([m["child"] for m in second], "children of the stopped world's engines")


def test_what_cells_started_on_mpi_ranks_ends_with_restart_and_with_stop(monkeypatch):
    if shutil.which("mpiexec") is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("needs mpiexec and mpi4py")
    tag = new_tag()
    monkeypatch.setenv("JAXSYS_TEST_RUN", tag)
    # Every rank on this machine; Open MPI makes each the leader of a process group.
    c = Cluster(hosts=2, devices_per_host=1, launcher="mpi", env={"JAX_PLATFORMS": "cpu"},
                progress=lambda e: None)  # fmt: skip
    second = []
    try:
        c.start_sync()
        first = c.world.view.apply_sync(_start_sleep)
        c.restart_sync()
        _wait_gone([m["child"] for m in first], "children of the old world's MPI ranks")
        second = c.world.view.apply_sync(_start_sleep)
    finally:
        c.kill()
    _wait_gone([m["child"] for m in second], "children of the stopped world's MPI ranks")
    assert not wait_no_processes(tag, timeout=15)


def test_what_cells_started_over_ssh_ends_with_restart_and_with_stop(monkeypatch, tmp_path):
    reason = sshd.available()
    if reason:
        pytest.skip(f"no ssh servers in network namespaces here: {reason}")
    tag = new_tag()
    monkeypatch.setenv("JAXSYS_TEST_RUN", tag)
    second = []
    with netns.TestHosts(2, prefix="tg") as hosts, sshd.SSHServers(hosts, tmp_path) as ssh:
        c = Cluster(
            hosts=[ssh.destination(i) for i in range(hosts.n)],
            devices_per_host=1,
            launcher="ssh",
            controller_ip=hosts.bridge_address,
            env={"JAX_PLATFORMS": "cpu"},
            launcher_options={"ssh_args": ssh.ssh_args, "scp_args": ssh.ssh_args},
            progress=lambda e: None,
        )
        try:
            c.start_sync()
            first = c.world.view.apply_sync(_start_sleep)
            c.restart_sync()
            # The hosts share this machine's pids (network namespaces only).
            _wait_gone([m["child"] for m in first], "children of the old world's engines")
            second = c.world.view.apply_sync(_start_sleep)
        finally:
            c.kill()
        _wait_gone([m["child"] for m in second], "children of the stopped world's engines")


def test_an_engine_holding_the_gil_is_gone_before_the_new_world_is_ready(cluster, tmp_path):
    old = [p.pid for p in cluster.processes]
    cluster.world.view.apply_async(_hold_the_gil, str(tmp_path))
    # Each engine names itself in tmp_path just before the match.
    deadline = time.monotonic() + WAIT_S
    while {p.name for p in tmp_path.iterdir()} != {str(pid) for pid in old}:
        assert time.monotonic() < deadline, "the engines never started the long match"
        time.sleep(0.05)
    cluster.restart_sync()
    assert not [pid for pid in old if _alive(pid)], "an old engine outlived the restart"
    assert cluster.world.view.apply_sync(lambda: 1) == [1, 1]


@contextlib.contextmanager
def _grandchild():
    """A ``sleep`` that is not this process's child (only its start time can vouch for
    it), and its shell, which prints its pid and then its exit status."""
    shell = subprocess.Popen(
        ["sh", "-c", "sleep 4321 & echo $!; wait $!; echo $?"], stdout=subprocess.PIPE, text=True
    )
    pid = int(shell.stdout.readline())
    started = start_time(pid)
    try:
        yield shell, pid, started
    finally:
        # The sleep first, if its pid still names it.
        killpg_all([pid], {pid: started})
        shell.kill()
        shell.wait(10)
        shell.stdout.close()


def test_a_pid_that_names_another_process_is_left_alone():
    with _grandchild() as (shell, pid, started):
        assert started is not None
        # What a reused pid looks like: the process there started at another time; and
        # without a start time, a process that is not this one's child.
        killpg_all([pid], {pid: started - 10.0})
        killpg_all([pid])
        # A SIGKILL sent above would have ended it before this SIGTERM arrives.
        os.kill(pid, signal.SIGTERM)
        assert shell.stdout.readline().strip() == str(128 + signal.SIGTERM)
    with _grandchild() as (shell, pid, started):
        killpg_all([pid], {pid: started})
        assert shell.stdout.readline().strip() == str(128 + signal.SIGKILL)
