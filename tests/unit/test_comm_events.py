"""The sidebar hears of every command, whatever surface gave it: a command carried out by
``%jaxsys`` or the dashboard reaches every open ``jaxsys`` comm as an ``event`` with the
fields ``protocol.ts`` declares; the comm's own commands get their reply only."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from IPython.core.error import UsageError

from jaxsys_kernel import protocol
from jaxsys_kernel.kernel import comm as jcomm
from jaxsys_kernel.magics import commands

from ..fakes import FakeComm

pytestmark = pytest.mark.unit


@pytest.fixture
def opened():
    """A comm served by ClusterComms that listens to the registry, as register() makes it."""
    comms = jcomm.ClusterComms(SimpleNamespace(cluster=None))
    comm = FakeComm()
    comms.on_open(comm)
    commands.LISTENERS.append(comms._on_command)
    yield comms, comm
    comms.close()
    assert comms._on_command not in commands.LISTENERS


def events(comm) -> list[dict]:
    return [m for m in comm.sent if m.get("type") == "event"]


def test_a_command_from_the_magic_reaches_the_sidebar(opened):
    _, comm = opened
    session = SimpleNamespace(cluster=None, restart=lambda: 1.25)
    commands.call(session, "restart", surface="jaxsys", progress=lambda _m: None)
    (event,) = events(comm)
    assert tuple(event) == protocol.INTERFACES["IEvent"]
    assert event["surface"] == "jaxsys" and event["action"] == "restart"
    assert event["ok"] is True and event["rank"] is None
    assert event["message"].startswith("JAX world restarted in 1.2"), event
    # The state follows, so the sidebar's rows and counters follow the new world.
    assert comm.sent[-1]["type"] in ("state", "delta")


def test_a_failed_command_from_the_magic_is_told_as_failed(opened):
    _, comm = opened

    def restart():
        raise UsageError("no cluster is running; start one with %jaxsys start")

    with pytest.raises(UsageError):
        commands.call(SimpleNamespace(restart=restart), "restart", surface="jaxsys")
    (event,) = events(comm)
    assert event["ok"] is False and "no cluster is running" in event["message"]


def test_the_comms_own_command_gets_no_event(opened):
    comms, comm = opened
    comms.on_msg({"content": {"data": {"type": "command", "action": "stacks", "id": "a"}}})
    assert events(comm) == []
    assert [m["type"] for m in comm.sent if m["type"] == "reply"] == ["reply"]


def test_a_dashboard_command_reaches_the_sidebar(opened):
    _, comm = opened
    # No cluster: the registry refuses, and the sidebar hears the refusal too.
    result = commands.run(SimpleNamespace(cluster=None), "kill", 1, surface="dashboard")
    assert not result.ok
    (event,) = events(comm)
    assert (event["surface"], event["action"], event["rank"]) == ("dashboard", "kill", 1)
    assert event["message"] == result.message
