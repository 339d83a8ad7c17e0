"""A pod's standby engine (engine/pod_standby.py): started when the Secret names it, kept
while it serves the world it took over, ended when that world or its kernel is gone."""

from __future__ import annotations

import json

import pytest

from jaxsys_kernel.engine import pod
from jaxsys_kernel.engine.pod_standby import (
    CONFIG_COPY,
    ENGINE_COPY,
    StandbySlot,
    entry_name,
    read_entry,
    with_copies,
)

pytestmark = pytest.mark.unit


class _Proc:
    def __init__(self):
        self.returncode = None

    def poll(self):
        return self.returncode


def _copies(folder) -> None:
    """The engine file and config every standby engine starts with."""
    (folder / ENGINE_COPY).write_text("{}")
    (folder / CONFIG_COPY).write_text("c = get_config()\n")


class _Pod:
    """A pod's Secret folder and what its slot started and ended."""

    def __init__(self, folder):
        self.folder = folder
        _copies(folder)
        self.started: dict[str, _Proc] = {}
        self.ended: list[str] = []
        self.said: list[str] = []
        self.slot = StandbySlot(0, self._start, self.said.append)

    def _start(self, entry):
        proc = self.started[entry["token"]] = _Proc()
        return proc, lambda: self.ended.append(entry["token"])

    def name(self, token: str | None) -> None:
        path = self.folder / entry_name(0)
        if token is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(json.dumps({"token": token, "env": {}, "args": []}))

    def look(self, generation: str) -> None:
        self.slot.poll(self.folder, generation)


def test_a_standby_named_survives_restarts_until_a_refill_names_the_next(tmp_path):
    p = _Pod(tmp_path)
    p.name("t1")
    p.look("g1")
    assert list(p.started) == ["t1"] and p.slot.busy()
    # A world restart: still a standby (named), so it runs on into the restart generation.
    p.look("restart-1")
    assert p.ended == []
    # It took over; the refill names the next standby under the same generation.
    p.name("t2")
    p.look("restart-1")
    assert list(p.started) == ["t1", "t2"] and p.ended == []
    # The next restart: t1 served the world that ends, t2 is the standby that takes over.
    p.look("restart-2")
    assert p.ended == ["t1"]
    # A keep names none: the last one ends too.
    p.name(None)
    p.look("kept-1")
    assert p.ended == ["t1", "t2"] and not p.slot.busy()


def test_a_standby_that_ended_on_its_own_is_not_started_again(tmp_path):
    p = _Pod(tmp_path)
    p.name("t1")
    p.look("g1")
    p.started["t1"].returncode = 0  # its kernel died: it left with the heartbeats
    p.look("g1")
    p.look("g1")
    assert list(p.started) == ["t1"] and not p.slot.busy()
    assert "standby engine t1 ended with exit code 0" in p.said


def test_an_entry_is_read_and_started_with_the_files_it_starts_with_or_not_at_all(tmp_path):
    (tmp_path / entry_name(3)).write_text(json.dumps({"token": "t", "env": {}, "args": []}))
    entry = read_entry(tmp_path, 3)
    assert entry == {"token": "t", "env": {}, "args": []}
    assert with_copies(tmp_path, entry) is None  # the engine file and config are not there yet
    # A slot does not start an entry without them, and starts it once they come.
    started = []
    slot = StandbySlot(3, lambda e: started.append(e) or (_Proc(), lambda: None), print)
    slot.poll(tmp_path, "g1")
    assert started == []
    _copies(tmp_path)
    slot.poll(tmp_path, "g1")
    assert started == [
        {
            **{"token": "t", "env": {}, "args": []},
            **{"engine_file": "{}", "config": "c = get_config()\n"},
        }
    ]
    (tmp_path / entry_name(3)).write_text("{not json")
    assert read_entry(tmp_path, 3) is None
    (tmp_path / entry_name(3)).write_text('{"no": "token"}')
    assert read_entry(tmp_path, 3) is None
    assert read_entry(tmp_path, 4) is None


def test_close_ends_every_standby(tmp_path):
    p = _Pod(tmp_path)
    p.name("t1")
    p.look("g1")
    p.slot.close()
    assert p.ended == ["t1"]


class _Clock:
    """Time that passes only in sleeps; the standby engine ``proc`` ends at 9 s."""

    def __init__(self, proc: _Proc):
        self.now = 0.0
        self.proc = proc

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        if self.now > 9.0:
            self.proc.returncode = 0


def test_a_pod_whose_standby_serves_a_world_does_not_end_after_its_wait(tmp_path):
    # The world restarted from the standby, so no generation brings an engine: the pod
    # waits as long as the standby engine runs, then its wait (2 s) from there.
    proc = _Proc()
    clock = _Clock(proc)
    (tmp_path / pod.GENERATION).write_text("restart-1")
    (tmp_path / pod.WAIT_FILE).write_text("2")
    (tmp_path / entry_name(0)).write_text(json.dumps({"token": "t1"}))
    _copies(tmp_path)
    slot = StandbySlot(0, lambda entry: (proc, lambda: None), lambda text: None)
    assert pod.next_engine(tmp_path, "g1", 5.0, clock, clock.sleep, slot=slot) is None
    assert 11.0 <= clock.now < 11.5
