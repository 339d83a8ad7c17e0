"""The suite's own rules: a test's kind is its folder, and unit tests start no process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from ..conftest import KINDS, _guarded, kind_of
from ..process_guard import NoProcesses, ProcessStarted

TESTS = Path(__file__).parents[1]


def test_every_test_file_sits_in_a_kinds_folder():
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert loose == [], f"move {loose} into one of tests/{{{','.join(KINDS)}}}/"
    assert kind_of(TESTS / "unit" / "test_x.py") == "unit"
    assert kind_of(TESTS / "live" / "deeper" / "test_x.py") == "live"
    assert kind_of(TESTS / "harness.py") is None and kind_of(Path("/elsewhere/x.py")) is None


def test_this_test_is_marked_by_its_folder(request):
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("live") is None


@pytest.mark.parametrize(
    "start",
    [
        lambda: subprocess.run([sys.executable, "-c", "pass"], check=False),
        lambda: subprocess.Popen(["true"]),
        lambda: os.system("true"),
        lambda: os.posix_spawn("/bin/true", ["true"], dict(os.environ)),
    ],
    ids=["subprocess.run", "Popen", "os.system", "os.posix_spawn"],
)
def test_a_guard_refuses_every_way_to_start_a_process(start):
    with NoProcesses("the example") as guard:
        with pytest.raises(ProcessStarted, match="the example started a process.*tests/live/"):
            start()
    assert len(guard.attempts) == 1


def test_a_swallowed_refusal_is_still_recorded():
    with NoProcesses("the example") as guard:
        try:
            subprocess.run(["true"], check=False)
        except Exception:  # noqa: BLE001 - what a careless test would do
            pass
    assert guard.attempts and guard.attempts[0].startswith("subprocess.Popen")


def test_a_thread_started_under_the_guard_is_watched():
    errors: list[BaseException] = []

    def spawn():
        try:
            subprocess.run(["true"], check=False)
        except ProcessStarted as e:
            errors.append(e)

    with NoProcesses("the example") as guard:
        t = threading.Thread(target=spawn)
        t.start()
        t.join(timeout=10)
    assert len(errors) == 1 and len(guard.attempts) == 1


def test_a_thread_older_than_the_guard_is_not_blamed():
    go, done = threading.Event(), threading.Event()
    outcome: list[str] = []

    def older():
        go.wait(timeout=10)
        try:
            outcome.append(str(os.system("true")))  # allowed: this thread is not the test's
        except ProcessStarted:
            outcome.append("refused")
        done.set()

    t = threading.Thread(target=older)
    t.start()
    with NoProcesses("the example") as guard:
        go.set()
        assert done.wait(timeout=10)
    t.join(timeout=10)
    assert outcome == ["0"] and guard.attempts == []


def test_unit_tests_themselves_run_under_the_guard():
    with pytest.raises(ProcessStarted, match="test_unit_tests_themselves_run_under_the_guard"):
        subprocess.run(["true"], check=False)
    # The refusal was the point here; left recorded, it would fail this test on the way out.
    NoProcesses._open[-1].attempts.clear()


def _unit_item(nodeid):
    return SimpleNamespace(
        nodeid=nodeid, get_closest_marker=lambda name: object() if name == "unit" else None
    )


def test_a_unit_test_that_swallowed_a_refusal_fails_when_its_phase_ends():
    phase = _guarded(_unit_item("tests/unit/test_x.py::test_careless"))
    next(phase)  # the phase runs now, guarded
    try:
        subprocess.run(["true"], check=False)
    except ProcessStarted:
        pass
    with pytest.raises(AssertionError, match="test_careless tried to start 1 process"):
        phase.send(None)


def test_a_test_of_another_kind_is_not_guarded():
    phase = _guarded(SimpleNamespace(nodeid="live", get_closest_marker=lambda name: None))
    next(phase)
    assert NoProcesses._open[-1].where.endswith("is_not_guarded")  # only this test's own guard
    with pytest.raises(StopIteration):
        phase.send(None)
