"""What the views say about a world tells the truth: a process restarted alone is told from
its predecessor, every view says a process's state in one vocabulary, and every package a
notebook names is an attribute."""

from __future__ import annotations

import functools
import inspect
import json
import re
import time
from types import SimpleNamespace

import nbformat
import pytest

from jaxsys_kernel.cluster.records import ProcessInfo
from jaxsys_kernel.kernel import comm
from jaxsys_kernel.magics import dashboard_wiring
from jaxsys_kernel.magics.session import MultihostSession
from jaxsys_kernel.protocol import ProcessState, shown_state
from jaxsys_kernel.telemetry import hub as hub_module
from jaxsys_kernel.telemetry import schema
from jaxsys_kernel.telemetry.hub import TelemetryHub
from jaxsys_kernel.widgets import fallback

from ..fakes import FakeCluster
from .test_notebooks import NOTEBOOKS

SHARDING = {"kind": "sharding", "shape": [8], "spec": ["x"], "blocks": []}


class WorldCluster(FakeCluster):
    """A running two-process cluster with a world: incarnation and per-rank restarts."""

    nprocs = 2
    security = "mTLS"
    heartbeat_timeout = 10.0

    def __init__(self, hub):
        super().__init__(hub)
        self.processes = [ProcessInfo(rank=r, state="ready", devices=[r]) for r in range(2)]
        self.world = SimpleNamespace(incarnation=1, rank_restarts={})
        self.restarts = 0

    def restart_sync(self):
        self.restarts += 1
        self.world.incarnation += 1
        return 0.5


@pytest.fixture
def hub():
    h = TelemetryHub(2, curve=False, interval=0.5)
    yield h
    h.close()


def beat(hub: TelemetryHub, rank: int, incarnation: int) -> None:
    ev = schema.event(schema.HEARTBEAT, rank, incarnation, time.time(), busy=False, devices=[rank])
    hub._take(json.dumps(ev).encode())


@pytest.fixture
def session(hub):
    s = MultihostSession()
    s.cluster = WorldCluster(hub)
    yield s
    if s._unsubscribe is not None:
        s._unsubscribe()


# -- a process restarted alone is told from its predecessor ------------------------------------


def _rows(session) -> dict[int, dict]:
    return {r["rank"]: r for r in comm.cluster_state(session)["cluster"]["processes"]}


def test_a_process_restarted_alone_shows_its_restarts_beside_the_incarnation(session, hub):
    for rank in (0, 1):
        beat(hub, rank, 1)
    before = _rows(session)
    assert [(r["incarnation"], r["restarts"]) for r in before.values()] == [(1, 0), (1, 0)]
    # What Cluster.restart_process does to the world: same incarnation, one more restart.
    session.cluster.world.rank_restarts[1] = 1
    beat(hub, 1, 1)
    after = _rows(session)
    assert (after[1]["incarnation"], after[1]["restarts"]) == (1, 1)
    assert after[0]["restarts"] == 0
    # The dashboard's liveness rows and their static table say the same.
    lives = [live.to_dict() for live in dashboard_wiring.process_liveness(session.cluster)]
    assert lives[1]["restarts"] == 1 and lives[1]["incarnation"] == 1
    text = fallback.live_text(lives, [])
    assert "1 · restarted 1×" in text and text.count("restarted") == 1


def test_without_a_world_the_counts_are_zero():
    assert dashboard_wiring.launch_counts(SimpleNamespace()) == (0, {})


# -- one vocabulary for a process's state ------------------------------------------------------


@pytest.mark.parametrize(
    "record,heard,shown",
    [
        ("ready", None, "alive"),
        ("ready", ProcessState.ALIVE, "alive"),
        ("ready", ProcessState.STUCK, "stuck"),
        ("ready", ProcessState.UNKNOWN, "unknown"),
        ("dead", ProcessState.ALIVE, "dead"),
        ("restarting", ProcessState.ALIVE, "restarting"),
        ("starting", None, "starting"),
        ("starting", ProcessState.ALIVE, "restarting"),
        ("failed", None, "dead"),
        (None, ProcessState.DEAD, "dead"),
    ],
)
def test_shown_state_is_the_one_translation(record, heard, shown):
    assert shown_state(record, heard) == shown


def test_the_clusters_word_reads_as_the_shown_one():
    assert ProcessState("ready") is ProcessState.ALIVE
    assert "ready" not in {s.value for s in ProcessState}
    with pytest.raises(ValueError, match="'bogus' is not a valid ProcessState"):
        ProcessState("bogus")


def test_the_hub_and_the_comm_say_the_same_word(session, hub):
    beat(hub, 0, 1)
    beat(hub, 1, 1)
    with_telemetry = {r: row["state"] for r, row in _rows(session).items()}
    session.cluster.telemetry = None
    without = {r: row["state"] for r, row in _rows(session).items()}
    assert with_telemetry == without == {0: "alive", 1: "alive"}


def test_no_other_module_translates_the_clusters_word():
    # "ready" -> "alive" lives in protocol.shown_state only; the hub and comm call it.
    for module in (comm, hub_module):
        source = inspect.getsource(module)
        assert not re.search(r"""["']ready["']""", source), module.__name__
        assert "shown_state" in source, module.__name__


# -- every package a notebook names is reachable as an attribute -------------------------------

_NAMED = re.compile(r"\bjaxsys_kernel((?:\.[A-Za-z_]\w*)+)")


def _names_in_notebooks() -> set[str]:
    names = set()
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            names.update(m.group(1).lstrip(".") for m in _NAMED.finditer(cell.source))
    return names


def _reach(name: str):
    """``jaxsys_kernel.<name>`` as a reader's fresh ``import jaxsys_kernel`` would reach it.

    Other tests import the subpackages, which sets them as attributes; so a name not defined
    in the package's own namespace is asked of the package's lazy ``__getattr__`` directly.
    """
    import jaxsys_kernel

    first, *rest = name.split(".")
    own = vars(jaxsys_kernel).get(first)
    if own is None or inspect.ismodule(own):
        own = jaxsys_kernel.__getattr__(first)
    return functools.reduce(getattr, rest, own)


def test_every_name_a_notebook_mentions_is_an_attribute_after_import_jaxsys_kernel():
    names = _names_in_notebooks()
    assert "data" in names, "the notebooks no longer name jaxsys_kernel.data"
    # The subpackages listed for lazy loading are reachable the same way.
    names |= {"data", "widgets", "cluster", "cells", "telemetry", "magics", "errors", "engine"}
    missing = []
    for name in sorted(names):
        try:
            _reach(name)
        except AttributeError as e:
            missing.append(f"{name}: {e}")
    assert not missing, "not reachable as attributes:\n" + "\n".join(missing)
    assert _reach("data").__name__ == "jaxsys_kernel.data"


def test_a_mistyped_name_says_what_there_is():
    import jaxsys_kernel

    with pytest.raises(AttributeError, match=r"no attribute 'dta'.*subpackages data"):
        jaxsys_kernel.dta  # noqa: B018
