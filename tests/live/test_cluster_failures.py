"""Clusters that cannot start: the error names the process, and nothing is left running.

No module-wide cluster here, so the census after each test sees only that test's processes.
"""

from __future__ import annotations

import time

import pytest

from jaxsys_kernel import Cluster, ClusterStartError

from ..harness import wait_no_processes


def test_failed_join_names_the_process(tag):
    c = Cluster(
        hosts=2,
        devices_per_host=1,
        process_env={1: {"JAX_PLATFORMS": "no-such-backend"}},
        progress=lambda e: None,
        init_timeout=20,
    )
    with pytest.raises(ClusterStartError) as info:
        c.start_sync()
    msg = str(info.value)
    assert "process 1 raised RuntimeError" in msg and "no-such-backend" in msg
    assert "process 0" in msg
    assert c.state == "stopped"
    assert not wait_no_processes(tag, timeout=10)


def _thread_gone(thread, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while thread.is_alive():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_engine_dying_before_registration_is_named(tag):
    # A wrong parent pid makes the engine's start-up guard exit at once.
    c = Cluster(
        hosts=2,
        devices_per_host=1,
        process_env={0: {"JAXSYS_PARENT_PID": "1"}},
        progress=lambda e: loop_threads.append(c._loop_thread),
    )
    loop_threads: list = []
    with pytest.raises(ClusterStartError, match="process 0 exited with code 1"):
        c.start_sync()
    assert not wait_no_processes(tag, timeout=10)
    # Nothing of the failed start is left in the kernel: the cluster's loop thread ends
    # (and the next cluster of this process starts: the test after this one).
    assert loop_threads and _thread_gone(loop_threads[0]), "the loop thread is still running"


def test_progress_reports_each_stage(tag):
    events = []
    c = Cluster(hosts=2, devices_per_host=1, progress=events.append)
    try:
        c.start_sync()
        loop_thread = c._loop_thread
    finally:
        c.kill()
    # A stopped cluster keeps no thread in the kernel.
    assert _thread_gone(loop_thread), "the stopped cluster's loop thread is still running"
    stages = [(e.stage, e.done, e.total) for e in events]
    assert ("engines registered", 2, 2) in stages
    assert ("processes initialised", 2, 2) in stages
    assert stages.index(("engines registered", 2, 2)) < stages.index(
        ("processes initialised", 2, 2)
    )
