"""The busy flag an engine's heartbeats carry: said before every cell's code runs (so that
a cell holding the GIL from its first line is shown stuck, not dead), and not sent again
for each of many back-to-back cells."""

from __future__ import annotations

import json
import threading

import pytest

from jaxsys_kernel.engine.agent import Agent

pytestmark = pytest.mark.unit


class _Socket:
    def __init__(self):
        self.sent: list[dict] = []

    def send_string(self, msg, flags=0):
        self.sent.append(json.loads(msg))


class _Agent(Agent):
    def _open(self):
        return _Socket()


def _beats(agent) -> list[bool]:
    return [m["busy"] for m in agent._sock.sent if m.get("kind") == "heartbeat"]


def _agent() -> _Agent:
    return _Agent("tcp://127.0.0.1:9", rank=0)


def test_a_cell_starting_after_an_idle_beat_says_busy_before_its_code_runs():
    agent = _agent()
    agent._heartbeat()  # the periodic beat, between cells
    agent._cell_started()
    assert _beats(agent) == [False, True]


def test_back_to_back_cells_send_one_busy_beat_and_the_next_periodic_beat_says_idle():
    agent = _agent()
    for _ in range(50):
        agent._cell_started()
        agent._cell_finished()
    assert _beats(agent) == [True]
    agent._heartbeat()  # the periodic beat after the cells
    agent._cell_started()  # the first cell after it says busy again
    assert _beats(agent) == [True, False, True]


def test_a_periodic_beat_during_a_cell_says_busy():
    agent = _agent()
    agent._cell_started()
    agent._heartbeat()
    agent._cell_finished()
    agent._heartbeat()
    assert _beats(agent) == [True, True, False]


def test_whatever_the_interleaving_the_last_beat_before_a_cells_code_says_busy():
    agent = _agent()
    stop = threading.Event()

    def periodic():
        while not stop.is_set():
            agent._heartbeat()

    t = threading.Thread(target=periodic)
    t.start()
    try:
        for _ in range(300):
            agent._cell_started()
            # What the kernel has heard last, as the cell's first line runs.
            with agent._beat_lock:
                assert _beats(agent)[-1] is True
            agent._cell_finished()
    finally:
        stop.set()
        t.join(5)
