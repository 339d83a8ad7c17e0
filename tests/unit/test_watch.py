"""Watchers: a kernel that watches a named cluster reads what its owner publishes, and is
refused every command that would run code on it, stop it or restart it."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
from IPython.core.error import UsageError

from jaxsys_kernel import contract
from jaxsys_kernel.cluster.watch import Watched
from jaxsys_kernel.errors import ConfigError
from jaxsys_kernel.magics import actions, commands
from jaxsys_kernel.magics.actions_watch import LiveStatus
from jaxsys_kernel.magics.session import MultihostSession

from ..harness import process_states

pytestmark = pytest.mark.unit


def _dead_pid() -> int:
    """A pid no process has (the highest pids are rarely given)."""
    pid = 4_194_000
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


def publish(directory, name="train", owner=None, cache_dir=None, **extra) -> dict:
    """Write the files ``jaxsys cluster start --name NAME`` writes for a ready cluster."""
    host = socket.gethostname()
    state = {
        "name": name,
        "pid": os.getpid() if owner is None else owner,
        "state": "ready",
        "processes": [
            {
                "rank": 0,
                "engine_id": 0,
                "pid": os.getpid(),
                "host": host,
                "devices": [0],
                "state": "ready",
            },
            {
                "rank": 1,
                "engine_id": 1,
                "pid": _dead_pid(),
                "host": host,
                "devices": [1],
                "state": "ready",
            },
        ],
        **extra,
    }
    (directory / f"{name}.json").write_text(json.dumps(state))
    (directory / f"{name}.options.json").write_text(json.dumps({"cache_dir": cache_dir}))
    return state


@pytest.fixture
def published(tmp_path, monkeypatch):
    monkeypatch.setenv(contract.STATE_DIR, str(tmp_path))
    publish(tmp_path, cache_dir=str(tmp_path / "cache"))
    return tmp_path


def test_a_watcher_reads_each_process_state_again(published):
    w = Watched("train")
    rows = w.rows()
    assert [(r["rank"], r["state"]) for r in rows] == [(0, "ready"), (1, "dead")]
    assert rows[0]["rss"] and rows[1]["rss"] is None
    assert "1 of 2 processes live" in w.headline()


def test_no_such_cluster_is_named_with_the_running_ones(published):
    with pytest.raises(ConfigError, match="no cluster named 'other'.*running here: train"):
        Watched("other")
    with pytest.raises(ConfigError, match="watch"):
        Watched("../etc")


def test_a_cluster_whose_owner_is_gone_cannot_be_watched(published):
    publish(published, name="gone", owner=_dead_pid())
    with pytest.raises(ConfigError, match="no cluster named 'gone'"):
        Watched("gone")


def test_a_state_file_that_is_not_a_clusters_is_refused(published):
    (published / "junk.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="no cluster named 'junk'"):
        Watched("junk")


def test_the_cache_is_read_from_the_disk(published):
    (published / "cache").mkdir()
    (published / "cache" / "entry").write_bytes(b"x" * 100)
    summary = Watched("train").cache()
    assert (summary.entries, summary.size, summary.complete) == (1, 100, True)


def _watching(capsys) -> MultihostSession:
    session = MultihostSession()
    actions.dispatch(session, "watch train")
    assert "watching cluster 'train' (read-only)" in capsys.readouterr().out
    return session


def test_status_and_cache_show_the_watched_cluster(published, capsys):
    session = _watching(capsys)
    actions.dispatch(session, "status")
    out = capsys.readouterr().out
    assert "owner `jaxsys cluster start --name train`" in out
    assert process_states(out) == {0: "ready", 1: "dead"}
    actions.dispatch(session, "cache")
    assert "cache: " in capsys.readouterr().out
    actions.dispatch(session, "unwatch")  # which ends the live status's thread


@pytest.mark.parametrize(
    "line", ["stop", "restart", "restart 1", "kill 1", "start --hosts 2", "cache clear", "logs 0"]
)
def test_a_watcher_cannot_change_the_cluster(published, capsys, line):
    session = _watching(capsys)
    with pytest.raises(UsageError) as e:
        actions.dispatch(session, line)
    message = str(e.value)
    assert "only watches cluster 'train'" in message and "%jaxsys unwatch" in message
    assert f"(pid {os.getpid()})" in message


def test_a_watcher_runs_no_cell(published, capsys):
    session = _watching(capsys)
    with pytest.raises(UsageError, match=r"%%multihost is refused: .*%jaxsys unwatch"):
        session.run_cell("print(1)")
    assert session.cluster is None


@pytest.mark.parametrize("surface", ["sidebar", "dashboard", "comm"])
def test_the_buttons_are_refused_too(published, capsys, surface):
    session = _watching(capsys)
    for name in commands.offered(surface):
        result = commands.run(session, name, 0 if name == "kill" else None, surface=surface)
        assert not result.ok and "only watches cluster 'train'" in result.message, name


def test_unwatch_ends_the_watch(published, capsys):
    session = _watching(capsys)
    actions.dispatch(session, "unwatch")
    assert "stopped watching cluster 'train'" in capsys.readouterr().out
    assert session.watching is None
    with pytest.raises(UsageError, match="watches no cluster"):
        actions.dispatch(session, "unwatch")


class Shown:
    """A display handle that records its updates (what a front end would redraw)."""

    def __init__(self):
        self.texts: list[str] = []

    def __call__(self, bundle, raw, display_id):
        self.texts.append(bundle["text/plain"])
        return self

    def update(self, bundle, raw):
        self.texts.append(bundle["text/plain"])


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.01)


def test_the_live_status_is_redrawn_until_unwatch(published, capsys):
    session = _watching(capsys)
    shown, texts = Shown(), iter(["a", "a", "b", "c", "d", "e", "f", "g", "h"])
    view = LiveStatus(session, lambda: next(texts, "z"), period=0.01, show=shown).start()
    wait_for(lambda: shown.texts[:3] == ["a", "b", "c"])  # an unchanged text is not sent
    actions.dispatch(session, "unwatch")
    view.thread.join(5)
    assert not view.thread.is_alive()


def test_a_newer_status_ends_the_older_one(published, capsys):
    session = _watching(capsys)
    first = LiveStatus(session, lambda: "1", period=0.01, show=Shown()).start()
    LiveStatus(session, lambda: "2", period=0.01, show=Shown()).start()
    first.thread.join(5)
    assert not first.thread.is_alive()
    session.watching = None
