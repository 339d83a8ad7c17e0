"""The readiness gate: no process joins JAX before every one has done its imports.

A process slow to import (played by ``JAXSYS_IMPORT_DELAY``, read by the engine's early
start-up) is named in the progress while the others wait, and the start succeeds with an
initialisation timeout far shorter than the delay.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from jaxsys_kernel import Cluster, ClusterStartError

from ..harness import run_on, wait_no_processes


def test_a_process_slow_to_import_is_named_and_no_join_times_out(tag):
    seen = []
    c = Cluster(
        hosts=2,
        devices_per_host=1,
        process_env={1: {"JAXSYS_IMPORT_DELAY": "1:12"}},
        progress=seen.append,
        init_timeout=4,
    )
    try:
        c.start_sync()
        assert "2" in run_on(c, "import jax; print(jax.process_count())")
    finally:
        c.kill()
    stages = [e.stage for e in seen]
    assert any("waiting for p1 (importing JAX)" in s for s in stages), stages
    assert not any("p0 (" in s for s in stages), stages
    assert not wait_no_processes(tag, timeout=10)


def test_a_process_dying_while_the_others_wait_for_it_is_named_at_once(tag):
    killed = []

    def progress(event):
        if "waiting for p1" in event.stage and not killed:
            pid = c.world.processes[1].pid
            killed.append(time.monotonic())
            os.kill(pid, signal.SIGKILL)

    c = Cluster(
        hosts=2,
        devices_per_host=1,
        process_env={1: {"JAXSYS_IMPORT_DELAY": "1:60"}},
        progress=progress,
        init_timeout=4,
    )
    with pytest.raises(ClusterStartError, match="process 1 ") as info:
        c.start_sync()
    took = time.monotonic() - killed[0]
    assert took < 10, (took, str(info.value))
    assert c.state == "stopped"
    assert not wait_no_processes(tag, timeout=10)


def test_a_process_dying_in_jaxs_own_join_is_named_within_the_heartbeat(tag):
    # Past the readiness gate every process has been asked to join; p1 dies there, and p0
    # would wait for it until JAX's own initialisation timeout (60 s here) without jaxsys.
    killed = []

    def progress(event):
        if event.stage == "processes initialised" and event.done == 0 and not killed:
            killed.append(time.monotonic())
            os.kill(c.world.processes[1].pid, signal.SIGKILL)

    # p1 waits before its join (JAXSYS_JOIN_DELAY) so that the kill finds it there: a join
    # takes a few ms, and a process killed after it would be no test of this.
    c = Cluster(
        hosts=2,
        devices_per_host=1,
        process_env={1: {"JAXSYS_JOIN_DELAY": "1:60"}},
        progress=progress,
        init_timeout=60,
        heartbeat_timeout=3,
    )
    try:
        with pytest.raises(ClusterStartError, match="process 1 exited with code -9") as info:
            c.start_sync()
        state = c.state
    finally:
        c.kill()  # only a test that failed has anything left to end
    took = time.monotonic() - killed[0]
    assert took <= 3 + 1, (took, str(info.value))
    assert "killed by SIGKILL" in str(info.value)
    assert state == "stopped"
    assert not wait_no_processes(tag, timeout=10)
