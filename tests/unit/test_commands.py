"""The command registry: one declaration per command, one meaning per name on every surface,
and the front ends' button lists and protocol.ts checked against it."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from jaxsys_kernel import protocol
from jaxsys_kernel.cluster.records import ProcessInfo
from jaxsys_kernel.kernel import comm as jcomm
from jaxsys_kernel.magics import actions, commands
from jaxsys_kernel.magics.session import MultihostSession

from ..fakes import FakeComm, FakeHub

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[2]
SRC = ROOT / "labextension" / "src"
LIVE_JS = ROOT / "jaxsys_kernel" / "widgets" / "static" / "live.js"


def _code(text: str) -> str:
    return re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)


# -- the registry and its surfaces ---------------------------------------------------------------


def test_the_wire_declaration_is_the_registrys_comm_commands_and_aliases():
    assert set(protocol.ACTIONS) == {*commands.offered("comm"), *commands.ALIASES}
    assert set(protocol.RANK_ACTIONS) == set(commands.needing_process())
    assert set(jcomm.ACTIONS) == set(protocol.ACTIONS)
    assert all(target in commands.COMMANDS for target in commands.ALIASES.values())


def test_every_command_is_declared_with_known_words():
    for c in commands.COMMANDS.values():
        assert c.process in ("none", "optional", "required"), c
        assert c.surfaces and c.surfaces <= set(commands.SURFACES), c
        assert "comm" in c.surfaces or not c.surfaces & {"sidebar", "dashboard"}, c


def test_every_command_offered_on_jaxsys_is_a_jaxsys_action():
    for name in commands.offered("jaxsys"):
        assert name in actions.ACTIONS, name


def sent_by_sidebar() -> set[str]:
    """The actions the sidebar's buttons and the palette's commands send."""
    sidebar = _code((SRC / "sidebar.ts").read_text())
    index = _code((SRC / "index.ts").read_text())
    listed = re.findall(r"\[\s*'([a-z-]+)',\s*'[A-Z]", sidebar)  # the top buttons
    rows = re.findall(r"this\.run\('([a-z-]+)'", sidebar)  # the rows' buttons
    palette = re.findall(r"\[\s*CommandIDs\.\w+,\s*'([a-z-]+)'", index)
    assert listed and rows and palette, "the button lists were not found"
    return {*listed, *rows, *palette}


def sent_by_dashboard() -> set[str]:
    """The actions the dashboard's buttons send (live.js's ``control(label, title, action)``)."""
    found = re.findall(r'control\("[^"]*",\s*"[^"]*",\s*"([a-z-]+)"', _code(LIVE_JS.read_text()))
    assert found, "live.js's buttons were not found"
    return set(found)


@pytest.mark.parametrize(
    "surface,sent", [("sidebar", sent_by_sidebar), ("dashboard", sent_by_dashboard)]
)
def test_the_buttons_are_the_commands_their_surface_offers(surface, sent):
    # Each button sends a current name (no alias) that its surface offers, and every command
    # the surface offers has a button.
    assert sent() == set(commands.offered(surface))


def test_the_button_parser_sees_a_changed_list(tmp_path, monkeypatch):
    fake = tmp_path / "live.js"
    fake.write_text(LIVE_JS.read_text().replace('"interrupt", null', '"stop", null'))
    monkeypatch.setattr(sys.modules[__name__], "LIVE_JS", fake)
    assert "stop" in sent_by_dashboard() and "interrupt" not in sent_by_dashboard()


# -- one meaning per name -----------------------------------------------------------------------


class Recorder:
    """A session whose lifecycle records what the registry asks of it."""

    def __init__(self, fail: Exception | None = None):
        self.calls: list[tuple] = []
        self.fail = fail
        self.cluster = SimpleNamespace(
            state="ready",
            nprocs=2,
            ranks=[0, 1],
            processes=[],
            telemetry=None,
            refresh_states=lambda: None,
            security="",
            heartbeat_timeout=10.0,
        )

    def _say(self, *call):
        self.calls.append(call)
        if self.fail is not None:
            raise self.fail
        return 0.5

    def restart(self):
        return self._say("restart")

    def restart_process(self, rank):
        return self._say("restart_process", rank)

    def kill_process(self, rank, signal_name="KILL"):
        return self._say("kill_process", rank, signal_name)


@pytest.mark.parametrize("surface", ["jaxsys", "dashboard", "comm"])
def test_restart_means_the_same_on_every_surface(surface):
    s = Recorder()
    commands.run(s, "restart", 1, surface=surface)
    commands.run(s, "restart", None, surface=surface)
    assert s.calls == [("restart_process", 1), ("restart",)]


def test_old_names_mean_what_they_meant():
    s = Recorder()
    # restart-world restarted the world whatever rank came with it.
    result = commands.run(s, "restart-world", 1, surface="comm")
    assert result.ok and s.calls == [("restart",)]
    assert commands.resolve("stop", None, "dashboard")[0].name == "interrupt"


@pytest.mark.parametrize(
    "name,rank,surface,code",
    [
        ("start", None, "dashboard", "unknown"),  # the dashboard has no start button
        ("explode", None, "comm", "unknown"),
        ("kill", None, "comm", "needs-process"),
        ("kill", "1", "dashboard", "usage"),  # a widget message is untrusted input
        ("kill", True, "dashboard", "usage"),
    ],
)
def test_refusals_are_results_with_a_code(name, rank, surface, code):
    s = Recorder()
    result = commands.run(s, name, rank, surface=surface)
    assert (result.ok, result.code) == (False, code) and s.calls == []
    assert result.message


def test_the_result_says_a_failure_whatever_its_wording():
    # A failure is a result's code, not a message that begins with "failed".
    result = commands.run(Recorder(RuntimeError("engine gone")), "kill", 1, surface="comm")
    assert (result.ok, result.code, result.message) == (False, "failed", "kill failed: engine gone")
    no_cluster = Recorder()
    no_cluster.cluster = None
    assert commands.run(no_cluster, "kill", 1, surface="comm").code == "no-cluster"


def test_the_comm_reply_takes_ok_from_the_result():
    session = Recorder(RuntimeError("kill failed to reach p1"))
    comms = jcomm.ClusterComms(session)
    comm = FakeComm()
    comms.comms.append(comm)  # opened: no state push needed for a reply
    comms.on_msg({"content": {"data": {"type": "command", "action": "kill", "rank": 1, "id": "a"}}})
    (reply,) = [m for m in comm.sent if m.get("type") == "reply"]
    assert reply["ok"] is False and reply["message"] == "kill failed: kill failed to reach p1"


def test_a_dashboard_restart_forgets_that_the_old_process_was_still_running():
    # Before the registry the dashboard's restart called the cluster directly, and the next
    # cell was refused as out of step.
    session = MultihostSession()
    restarted = []
    session.cluster = SimpleNamespace(
        state="ready", restart_process_sync=lambda r: restarted.append(r) or 0.5
    )
    session.still_running = {1}
    view = SimpleNamespace(control_status="", lines=[])
    view.update = lambda append=(): view.lines.extend(append)
    result = session.control(view, "restart", 1)
    assert result.ok and restarted == [1] and session.still_running == set()
    assert view.control_status == "p1 rejoined in 0.5 s"
    assert any(line.endswith("p1 restarting...") for line in view.lines)


# -- protocol.ts, every interface ----------------------------------------------------------------


def ts_interfaces() -> dict[str, list[str]]:
    """Every ``export interface`` of protocol.ts with its field names, in order."""
    text = _code((SRC / "protocol.ts").read_text())
    found = re.findall(r"export interface (\w+)\s*\{(.*?)\n\}", text, flags=re.S)
    return {name: re.findall(r"^\s*(\w+)\??:", body, flags=re.M) for name, body in found}


def test_every_interface_of_protocol_ts_is_declared_field_by_field():
    declared = {name: list(fields) for name, fields in protocol.INTERFACES.items()}
    assert ts_interfaces() == declared


def _cluster(hub):
    procs = [
        ProcessInfo(rank=r, host="h", pid=100 + r, devices=[r], state="ready") for r in range(2)
    ]
    return SimpleNamespace(
        state="ready",
        nprocs=2,
        processes=procs,
        telemetry=hub,
        security="mTLS",
        heartbeat_timeout=10.0,
        refresh_states=lambda: None,
    )


@pytest.mark.parametrize("hub", [FakeHub(), None], ids=["telemetry", "none"])
def test_what_the_comm_builds_has_the_declared_fields(hub):
    state = jcomm.cluster_state(SimpleNamespace(cluster=_cluster(hub)))
    fields = protocol.INTERFACES
    assert set(state) <= set(fields["IState"]) and "error" not in state
    assert list(state["health"]) == list(fields["IHealth"])
    assert list(state["cluster"]) == list(fields["ICluster"])
    for row in state["cluster"]["processes"]:
        assert list(row) == list(fields["IProcess"])
    if hub is not None:
        assert set(state["cluster"]["cache"]) == set(fields["ICache"])


def test_a_reply_has_the_declared_fields():
    comms = jcomm.ClusterComms(Recorder())
    comm = FakeComm()
    comms.comms.append(comm)
    comms.on_msg({"content": {"data": {"type": "command", "action": "restart", "id": "b"}}})
    (reply,) = [m for m in comm.sent if m.get("type") == "reply"]
    assert list(reply) == list(protocol.INTERFACES["IReply"]) and reply["ok"] is True


def test_a_preemption_notice_is_said_sent_not_killed():
    s = Recorder()
    result = commands.run(s, "kill", 1, surface="jaxsys", options={"signal": "TERM"})
    assert s.calls == [("kill_process", 1, "TERM")]
    assert result.message == "sent SIGTERM to p1"
