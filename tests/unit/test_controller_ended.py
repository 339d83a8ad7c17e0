"""A controller that has ended is seen at once, before its launcher has heard how: the waits
of a world restart end on it instead of running out."""

from __future__ import annotations

import asyncio
import os
import time
from types import SimpleNamespace

from jaxsys_kernel.cluster import reply_limit
from jaxsys_kernel.cluster.bringup import controller_failure
from jaxsys_kernel.cluster.teardown import client_end_wait, controller_ended, wait_dropped

from .free_pid import free_pid


def _world(pid: int, state: str = "running", stop_data=None, ids=(0, 1)):
    ctl = SimpleNamespace(pid=pid, state=state, stop_data=stop_data)
    return SimpleNamespace(
        ipp=SimpleNamespace(controller=ctl),
        client=SimpleNamespace(ids=list(ids)),
        report=lambda *a: None,
    )


def test_a_running_controller_has_not_ended():
    world = _world(os.getpid())
    assert not controller_ended(world)
    assert controller_failure(world) is None


def test_a_controller_whose_pid_is_gone_has_ended_before_its_launcher_knows():
    pid = free_pid()
    world = _world(pid)
    assert controller_ended(world)
    said = controller_failure(world)
    assert said is not None and f"(pid {pid})" in said and "%jaxsys start" in said, said


def test_the_launchers_word_on_how_it_ended_is_used_once_it_has_it():
    world = _world(free_pid(), state="after", stop_data={"exit_code": -9})
    assert "killed by SIGKILL" in controller_failure(world)


def test_without_a_controller_of_its_own_nothing_has_ended():
    world = SimpleNamespace(ipp=SimpleNamespace(controller=None))
    assert not controller_ended(world)
    assert controller_failure(world) is None


def test_waiting_for_a_dead_hub_to_drop_engines_ends_at_once():
    world = _world(free_pid())
    t0 = time.monotonic()
    asyncio.run(wait_dropped(world, {0, 1}, timeout=5.0))
    assert time.monotonic() - t0 < 1.0


def test_waiting_for_a_live_hub_that_drops_nothing_runs_to_its_bound():
    world = _world(os.getpid())
    t0 = time.monotonic()
    asyncio.run(wait_dropped(world, {0, 1}, timeout=0.3))
    assert time.monotonic() - t0 >= 0.3


def test_the_client_of_an_ended_controller_is_not_waited_for():
    assert client_end_wait(_world(free_pid())) == reply_limit.CONTEXT_END_DEAD_S
    assert client_end_wait(_world(os.getpid())) == reply_limit.CONTEXT_END_S
