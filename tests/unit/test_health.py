"""One word for the cluster's state, the same in every view."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jaxsys_kernel.kernel import comm as jcomm
from jaxsys_kernel.magics.health import health

from .test_labextension import FakeHub, fake_cluster


def test_no_cluster_is_stopped():
    said = health(None)
    assert said.state == "stopped" and not said.warning
    assert health(SimpleNamespace(state="stopped")).state == "stopped"


@pytest.mark.parametrize(
    "states,expected,warning,reason",
    [
        (("ready", "ready"), "ready", False, ""),
        (("ready", "dead"), "degraded", True, "p1 dead"),
        (("ready", "restarting"), "restarting", False, "p1 restarting"),
        (("dead", "restarting"), "degraded", True, "p0 dead, p1 restarting"),
    ],
)
def test_process_states_decide(states, expected, warning, reason):
    said = health(fake_cluster(states))
    assert (said.state, said.warning, said.reason) == (expected, warning, reason)


def test_out_of_step_wins_over_ready_and_says_what_to_do():
    said = health(fake_cluster(), broken="p1 interrupted inside JAX at 12:00:00")
    assert said.state == "out of step" and said.warning
    assert said.line() == (
        "cluster: out of step (p1 interrupted inside JAX at 12:00:00; "
        "cells are refused until %jaxsys restart)"
    )


def test_the_comm_sends_the_same_state():
    session = SimpleNamespace(cluster=fake_cluster(hub=FakeHub()), broken="p1 interrupted")
    state = jcomm.cluster_state(session)
    assert state["health"]["state"] == "out of step" and state["health"]["warning"] is True
    session.broken = None
    assert jcomm.cluster_state(session)["health"] == {
        "state": "ready",
        "reason": "",
        "warning": False,
    }
    assert jcomm.cluster_state(SimpleNamespace(cluster=None))["health"]["state"] == "stopped"
