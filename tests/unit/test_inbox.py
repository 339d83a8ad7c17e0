"""The queue between the client's IO thread and the cell loop: what wakes the loop, what
never reaches it, and a burst of replies taken in one go."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future

import pytest

from jaxsys_kernel.cells import inbox
from jaxsys_kernel.cells.inbox import Events, Inbox
from jaxsys_kernel.cells.run import CellMachine
from jaxsys_kernel.cells.send import Driver

from .test_cellrun import Recorder, replied


def message(msg_type: str, **content) -> dict:
    return {"header": {"msg_type": msg_type}, "content": content}


def request_future() -> Future:
    """A stand-in for ipyparallel's MessageFuture: a future with iopub callbacks and an
    output future."""
    fut: Future = Future()
    fut.iopub_callbacks = []
    fut.output = Future()
    return fut


def drain(events: Events) -> list[tuple]:
    taken = []
    while True:
        try:
            taken.append(events.get(timeout=0))
        except queue.Empty:
            return taken


def test_only_what_the_cell_machine_reads_reaches_the_queue():
    events = Events(expected=2)
    fut = request_future()
    Inbox(events, rank=3).attach(fut)
    for kind in ("status", "execute_input", "stream", "clear_output", "error"):
        for callback in fut.iopub_callbacks:
            callback(message(kind))
    assert [(r, k, p["header"]["msg_type"]) for r, k, p in drain(events)] == [
        (3, "iopub", "stream"),
        (3, "iopub", "error"),
    ]


def test_output_cut_short_by_the_bound_is_said_on_the_process_stderr():
    from jaxsys_kernel.cluster.reply_limit import OutputTooLarge

    events = Events(expected=2)
    fut = request_future()
    Inbox(events, rank=2).attach(fut)
    fut.output.set_exception(OutputTooLarge("output over the kernel's limit"))
    taken = drain(events)
    assert [(r, k) for r, k, _ in taken] == [(2, "iopub"), (2, "idle")]
    said = taken[0][2]
    assert said["header"]["msg_type"] == "stream" and said["content"]["name"] == "stderr"
    assert "output over the kernel's limit" in said["content"]["text"]
    # Any other end of the output (a dead engine) adds nothing.
    other = request_future()
    Inbox(events, rank=1).attach(other)
    other.output.set_exception(RuntimeError("engine died"))
    assert [(r, k) for r, k, _ in drain(events)] == [(1, "idle")]


def test_output_wakes_the_loop_and_the_end_of_a_process_only_with_the_last():
    events = Events(expected=4)
    first, second = request_future(), request_future()
    Inbox(events, 0).attach(first)
    Inbox(events, 1).attach(second)
    first.set_result("reply")
    first.output.set_result(None)
    second.set_result("reply")
    assert not events._ready.is_set()  # three of four: the loop sleeps on
    second.output.set_result(None)
    assert events._ready.is_set()
    assert [(r, k) for r, k, _ in drain(events)] == [
        (0, "reply"),
        (0, "idle"),
        (1, "reply"),
        (1, "idle"),
    ]
    events._ready.clear()
    events.put((0, "iopub", message("stream")))
    assert events._ready.is_set()


def test_a_dead_engine_wakes_the_loop_at_once():
    events = Events(expected=4)
    fut = request_future()
    Inbox(events, 0).attach(fut)
    fut.set_exception(RuntimeError("engine gone"))
    assert events._ready.is_set()
    assert [(r, k) for r, k, _ in drain(events)] == [(0, "reply")]


def test_the_last_end_wakes_a_waiting_loop_before_its_lag(monkeypatch):
    monkeypatch.setattr(inbox, "LAG", 60.0)
    events = Events(expected=1)
    got: list[tuple] = []
    waiter = threading.Thread(target=lambda: got.append(events.get(timeout=60.0)))
    waiter.start()
    events.put_end((0, "idle", None))
    waiter.join(timeout=20)
    assert not waiter.is_alive() and got == [(0, "idle", None)]


def test_an_event_that_wakes_nobody_is_taken_within_the_lag(monkeypatch):
    monkeypatch.setattr(inbox, "LAG", 0.05)
    events = Events(expected=2)
    got: list[tuple] = []
    waiter = threading.Thread(target=lambda: got.append(events.get(timeout=60.0)))
    waiter.start()
    events.put_end((0, "reply", None))  # not the last: wakes nobody
    waiter.join(timeout=20)
    assert not waiter.is_alive() and got == [(0, "reply", None)]


def test_an_empty_queue_says_so_without_waiting_past_the_timeout():
    events = Events(expected=2)
    with pytest.raises(queue.Empty):
        events.get(timeout=0)
    with pytest.raises(queue.Empty):
        events.get(block=False)
    with pytest.raises(queue.Empty):
        events.get(timeout=0.01)


def test_the_loop_takes_a_burst_of_replies_in_one_step():
    procs = list(range(64))
    m = CellMachine(procs, Recorder())
    events = Events(expected=2 * len(procs))
    for r in procs:
        events.put_end((r, "reply", replied()))
        events.put_end((r, "idle", None))
    driver = Driver(m, events, lambda ranks: ranks)
    assert driver.advance() is False  # one wait step takes every event queued
    assert not m.running
    assert driver.advance() is True
    assert driver.run().by_status("ok") == procs
