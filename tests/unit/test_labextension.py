"""The labextension's packaging (one version, installed prebuilt) and the jaxsys comm's logic
without a kernel: command parsing, the state it pushes, and following the telemetry hub."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from IPython.core.error import UsageError
from packaging.version import Version

from jaxsys_kernel import __version__
from jaxsys_kernel.cluster.records import ProcessInfo
from jaxsys_kernel.kernel import comm as jcomm

from ..fakes import FakeComm, FakeHub

ROOT = Path(__file__).parents[2]
EXT = ROOT / "labextension"
PACKAGE = json.loads((EXT / "package.json").read_text())
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


# -- packaging ---------------------------------------------------------------------------------


def test_python_and_package_json_have_one_version():
    assert Version(PACKAGE["version"]) == Version(__version__), (PACKAGE["version"], __version__)


def test_the_kernel_names_the_editor_language_the_extension_adds():
    from jaxsys_kernel import contract
    from jaxsys_kernel.kernel.kernel import JaxSysKernel

    source = (EXT / "src" / "highlight.ts").read_text()
    assert f"LANGUAGE_NAME = '{contract.EDITOR_LANGUAGE}'" in source
    mode = JaxSysKernel.language_info["codemirror_mode"]
    # Named first; without the extension JupyterLab falls back to its IPython by mime type.
    assert mode["name"] == contract.EDITOR_LANGUAGE and mode["mime"] == "text/x-ipython"
    assert JaxSysKernel.language_info["pygments_lexer"] == "ipython3"


# -- commands ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data,expected",
    [
        ({"type": "command", "action": "kill", "rank": 2, "id": "a"}, ("kill", 2, "a")),
        ({"action": "stop", "rank": None}, ("stop", None, "")),  # a dashboard control
        ({"type": "command", "action": "start"}, ("start", None, "")),
    ],
)
def test_parse_command(data, expected):
    assert jcomm.parse_command(data) == expected


@pytest.mark.parametrize(
    "data,fragment",
    [
        ("kill", "a JSON object"),
        ({"action": "explode"}, "unknown action 'explode'"),
        ({"action": "kill"}, "kill needs a process"),
        ({"action": "restart", "rank": "2"}, "rank must be a process number"),
        ({"action": "kill", "rank": -1}, "rank must be a process number"),
        ({"action": "kill", "rank": True}, "rank must be a process number"),
    ],
)
def test_parse_command_refuses_bad_input(data, fragment):
    with pytest.raises(jcomm.CommandError, match=re.escape(fragment)):
        jcomm.parse_command(data)


# -- state -------------------------------------------------------------------------------------


def fake_cluster(states=("ready", "ready"), hub=None):
    procs = [
        ProcessInfo(rank=r, host="h", pid=100 + r, devices=[2 * r, 2 * r + 1], state=s)
        for r, s in enumerate(states)
    ]
    return SimpleNamespace(
        state="ready",
        nprocs=len(procs),
        processes=procs,
        telemetry=hub,
        security="mTLS on the coordination service",
        heartbeat_timeout=10.0,
        refresh_states=lambda: None,
    )


def test_state_without_a_cluster():
    state = jcomm.cluster_state(SimpleNamespace(cluster=None), cell_running=True)
    assert state["cluster"] is None and state["cell_running"] is True
    assert state["kernel"]["version"] == __version__


def test_state_of_a_healthy_cluster():
    session = SimpleNamespace(cluster=fake_cluster(hub=FakeHub()))
    c = jcomm.cluster_state(session)["cluster"]
    assert (c["nprocs"], c["alive"], c["devices"], c["live_devices"]) == (2, 2, 4, 4)
    assert c["warning"] is False
    assert c["cache"]["requests"] == 8 and c["cache"]["hit_rate"] == 0.5
    assert [p["busy"] for p in c["processes"]] == [True, False]
    json.dumps(c)  # what the comm sends must be JSON


@pytest.mark.parametrize(
    "states,hub_states,alive,warning",
    [
        (("ready", "dead"), {}, 1, True),  # killed: the cluster knows at once
        (("ready", "ready"), {1: "stuck"}, 1, True),  # late heartbeats while busy
        (("ready", "restarting"), {}, 1, False),  # coming back: not a warning
        (("ready", "ready"), {1: "unknown"}, 1, False),  # no heartbeat yet
    ],
)
def test_state_counts_and_warns(states, hub_states, alive, warning):
    session = SimpleNamespace(cluster=fake_cluster(states, FakeHub(hub_states)))
    c = jcomm.cluster_state(session)["cluster"]
    assert (c["alive"], c["warning"], c["live_devices"]) == (alive, warning, 2 * alive)


def test_state_without_telemetry_uses_the_clusters_view():
    session = SimpleNamespace(cluster=fake_cluster(("ready", "dead"), hub=None))
    c = jcomm.cluster_state(session)["cluster"]
    assert [p["state"] for p in c["processes"]] == ["alive", "dead"]
    assert c["cache"] is None and c["warning"] is True


# -- the comm object ---------------------------------------------------------------------------


def test_comms_follow_the_current_hub_and_stop_when_closed():
    hub_a, hub_b = FakeHub(), FakeHub()
    session = SimpleNamespace(cluster=fake_cluster(hub=hub_a))
    comms = jcomm.ClusterComms(session)
    comm = FakeComm()
    comms.on_open(comm)
    assert comm.sent[-1]["type"] == "state" and comm.sent[-1]["v"] == jcomm.SCHEMA_VERSION
    assert len(hub_a.subscribed) == 1
    hub_a.subscribed[0](hub_a)  # a telemetry update pushes the state
    assert len(comm.sent) == 2
    session.cluster = fake_cluster(hub=hub_b)  # a new cluster, a new hub
    comms.push()
    assert (len(hub_a.subscribed), len(hub_b.subscribed)) == (0, 1)
    comm.handlers["close"]({})
    assert hub_b.subscribed == [] and comms.comms == []


def test_a_command_gets_a_reply_and_a_state():
    def start():
        raise UsageError("a cluster of 2 processes is already running")

    session = SimpleNamespace(cluster=None, start=start)
    comms = jcomm.ClusterComms(session)
    comm = FakeComm()
    comms.on_open(comm)
    comm.handlers["msg"]({"content": {"data": {"type": "command", "action": "start", "id": "x"}}})
    reply, state = comm.sent[-2:]
    assert reply == {
        "type": "reply",
        "id": "x",
        "action": "start",
        "ok": False,
        "message": "a cluster of 2 processes is already running",
        "log": [],
    }
    assert state["type"] == "state"


def test_comms_of_reloaded_pages_do_not_pile_up():
    comms = jcomm.ClusterComms(SimpleNamespace(cluster=None))
    opened = [FakeComm() for _ in range(jcomm.MAX_COMMS + 2)]
    for comm in opened:
        comms.on_open(comm)
    assert comms.comms == opened[2:]
    assert [c.closed for c in opened[:3]] == [True, True, False]
