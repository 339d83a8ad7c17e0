"""The ipyparallel controller's death, as every view reads it: the cluster is degraded,
and the reason says that cells still run, that no process can come back, and what to do."""

from __future__ import annotations

import os
import types

import pytest

from jaxsys_kernel.magics.health import DEGRADED, READY, controller_lost, health

pytestmark = pytest.mark.unit


def _cluster(controller_state: str = "running", exit_code=None, ranks=(0, 1)):
    # A running controller's pid is a live process's (a gone pid is an ended controller).
    pid = 4321 if controller_state == "after" else os.getpid()
    controller = types.SimpleNamespace(
        state=controller_state, pid=pid, stop_data={"exit_code": exit_code}
    )
    world = types.SimpleNamespace(ipp=types.SimpleNamespace(controller=controller))
    processes = [types.SimpleNamespace(rank=r, state="alive") for r in ranks]
    return types.SimpleNamespace(state="ready", world=world, processes=processes)


def test_a_running_controller_leaves_the_cluster_ready():
    assert controller_lost(_cluster()) is None
    assert health(_cluster()).state == READY


def test_a_killed_controller_makes_the_cluster_degraded_saying_what_to_do():
    got = health(_cluster("after", -9))
    assert got.state == DEGRADED and got.warning
    assert got.reason.startswith("the ipyparallel controller (pid 4321) was killed by SIGKILL")
    assert "cells still run, but no process can be restarted" in got.reason
    assert got.reason.endswith("then %jaxsys stop and %jaxsys start")
    assert "\n" not in got.reason


def test_a_controller_that_exited_is_named_in_one_line_with_dead_processes_first():
    got = health(_cluster("after", 1), process_states={0: "alive", 1: "dead"})
    assert got.reason.startswith("p1 dead; the ipyparallel controller (pid 4321) exited (code 1)")
    assert "\n" not in got.reason


def test_a_cluster_without_a_controller_of_its_own_is_not_judged():
    assert controller_lost(types.SimpleNamespace(state="ready")) is None
    assert controller_lost(types.SimpleNamespace(world=types.SimpleNamespace(ipp=None))) is None
