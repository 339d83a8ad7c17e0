"""Cluster operations on real engines: Cluster.call, and the lock that orders restarts."""

from __future__ import annotations

import os
import threading
import time

import pytest

from jaxsys_kernel.cluster.calls import ProcessNotRunning


def _pid_and_rank():
    import jax

    return os.getpid(), jax.process_index()


def test_call_runs_on_the_chosen_processes_and_names_the_silent_ones(cluster):
    calls = cluster.call(None, _pid_and_rank, timeout=30)
    assert calls.ok
    assert {r: rank for r, (_, rank) in calls.results.items()} == {0: 0, 1: 1}
    assert [pid for pid, _ in calls.results.values()] == [p.pid for p in cluster.processes]
    slow = cluster.call([1], time.sleep, 2.0, timeout=0.2)
    assert slow.missing == [1] and not slow.results
    # The busy engine finishes its sleep, then answers again.
    assert cluster.call([1], _pid_and_rank, timeout=30).values()[1][1] == 1


def test_a_world_restart_and_a_rejoin_asked_at_once_run_one_after_the_other(cluster):
    done: dict[str, tuple[float, float]] = {}
    errors: list[BaseException] = []

    def timed(name, fn, *args):
        try:
            t0 = time.monotonic()
            fn(*args)
            done[name] = (t0, time.monotonic())
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    world = threading.Thread(target=timed, args=("world", cluster.restart_sync))
    one = threading.Thread(target=timed, args=("one", cluster.restart_process_sync, 1))
    world.start()
    # Wait (bounded) until the world restart holds the cluster, then ask for the rejoin.
    deadline = time.monotonic() + 30
    while cluster.state != "restarting" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cluster.state == "restarting", "the world restart never began"
    one.start()
    world.join(180)
    one.join(180)
    assert not errors, errors
    assert set(done) == {"world", "one"}
    # Interleaved, the rejoin would kill process 1 while the new world is still joining.
    assert done["one"][1] > done["world"][1]
    assert cluster.state == "ready"
    assert [p.state for p in cluster.processes] == ["ready", "ready"]
    assert cluster.call(None, _pid_and_rank, timeout=30).ok


def test_call_refuses_a_dead_process(cluster):
    cluster.kill_process(1)
    with pytest.raises(ProcessNotRunning, match="process 1 is dead"):
        cluster.call([0, 1], os.getpid)
    cluster.restart_sync()
    assert cluster.call(None, os.getpid, timeout=30).ok
