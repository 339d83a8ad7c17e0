"""How a step's end is found from where the cell stores its result, and the thread that
stamps the ends: its bound, its drain and a failure inside it."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from jaxsys_kernel.cells.step_records import checked
from jaxsys_kernel.engine import arrivals, step_calls, step_ends
from jaxsys_kernel.engine.state import STATE

pytestmark = pytest.mark.unit

CELL = "<cell-under-test>"


def _stores(source: str) -> list[tuple]:
    code = compile(source, CELL, "exec")
    return list(step_calls._stores_after_calls(code).values())


def test_the_names_a_call_stores_its_result_in_are_read_from_the_code():
    assert _stores("w = f(w, x)\n") == [((False, "w"),)]
    assert _stores("state, loss = f(state, b)\n") == [((False, "state"), (False, "loss"))]
    assert _stores("y = g(f(w))\n") == [((False, "y"),)]  # the outer call's result only
    # Not in plain names: a printed, appended or attribute-stored result is left to the
    # look at every live array.
    assert _stores("print(f(w))\n") == []
    assert _stores("out.append(f(w))\n") == []
    assert _stores("o.w = f(w)\n") == []
    assert _stores("a, o.b = f(w)\n") == []


def test_a_global_store_inside_a_function_is_read_from_the_globals():
    code = compile("def g():\n    global w\n    w = f(w)\n", CELL, "exec")
    inner = next(c for c in code.co_consts if hasattr(c, "co_code"))
    assert list(step_calls._stores_after_calls(inner).values()) == [((True, "w"),)]


def _cell(monkeypatch, code: str, fallback: list) -> list[dict]:
    """Run ``code`` as a cell with the records on, counting looks at every live array."""
    pytest.importorskip("jax")
    monkeypatch.setattr(arrivals, "_is_cell_file", lambda f: f == CELL)
    assert arrivals.enable() == "on"
    try:
        rec = STATE.arrivals
        rec.spans = lambda result: True
        everything = rec.unfinished

        def counted():
            fallback.append(1)
            return everything()

        rec.unfinished = counted
        exec(compile(code, CELL, "exec"), {})
        return [checked(s) for s in arrivals.records()["steps"]]
    finally:
        arrivals.disable()


LOOP = (
    "import jax, jax.numpy as jnp\n"
    "f = jax.jit(lambda w: (jnp.tanh(w @ w) * 1e-3, w.sum()))\n"
    "w = jnp.ones((256, 256))\n"
)


def test_a_stored_result_ends_its_step_without_listing_every_live_array(monkeypatch):
    fallback = []
    code = LOOP + "for i in range(4):\n    w, loss = f(w)\n"
    steps = _cell(monkeypatch, code, fallback)
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert all(a["end"] <= b["start"] for a, b in zip(steps, steps[1:], strict=False))
    # The last step is settled as the cell ends: its line stored the result too.
    assert fallback == []


def test_a_result_kept_elsewhere_is_found_among_the_live_arrays(monkeypatch):
    fallback = []
    code = LOOP + "out = []\nfor i in range(3):\n    out.append(f(w))\n"
    steps = _cell(monkeypatch, code, fallback)
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert len(fallback) == 3


def test_inside_a_function_of_the_cell_the_locals_are_read(monkeypatch):
    fallback = []
    code = (
        LOOP
        + "def train(w):\n    for i in range(3):\n        w, _ = f(w)\n    return w\nw = train(w)\n"
    )
    steps = _cell(monkeypatch, code, fallback)
    assert [s["step"] for s in steps] == [0, 1, 2] and fallback == []


def test_the_frame_a_monitoring_callback_reads_is_the_calling_lines():
    # stored_arrays relies on it: sys._getframe(1) in a C_RETURN callback is the caller's.
    mon = sys.monitoring
    tool = next(t for t in range(6) if mon.get_tool(t) is None)
    seen = []

    def on_return(code, offset, fn, arg0):
        if code.co_filename == CELL:
            seen.append(sys._getframe(1).f_code is code)

    mon.use_tool_id(tool, "test")
    try:
        mon.register_callback(tool, mon.events.C_RETURN, on_return)
        mon.register_callback(tool, mon.events.C_RAISE, lambda *a: None)
        mon.register_callback(tool, mon.events.CALL, lambda *a: None)
        mon.set_events(tool, mon.events.CALL | mon.events.C_RETURN | mon.events.C_RAISE)
        exec(compile("x = len([1])\ndef g():\n    y = len([2])\ng()\n", CELL, "exec"), {})
    finally:
        mon.set_events(tool, 0)
        mon.free_tool_id(tool)
    assert seen == [True, True]


def test_a_full_queue_holds_the_caller_until_a_step_ends():
    go, stamped = threading.Event(), []
    ends = step_ends.StepEnds(
        lambda item, end: stamped.append(item), wait=lambda a: go.wait(5), limit=2
    )
    try:
        ends.put(0, [])
        ends.put(1, [])
        third = threading.Thread(target=ends.put, args=(2, []))
        third.start()
        deadline = time.monotonic() + 5
        while not ends._watched and time.monotonic() < deadline:
            time.sleep(0.001)  # until the third put is seen waiting for a place
        # Two awaited: the third waits, not yet handed over.
        assert ends._watched and third.is_alive() and ends._put == 2
        go.set()
        third.join(5)
        assert not third.is_alive()
        assert ends.drain(5) and stamped == [0, 1, 2] and ends.idle()
    finally:
        go.set()
        ends.close()


def test_a_step_whose_stamp_fails_does_not_stop_the_ones_after(capsys):
    stamped = []

    def finish(item, end):
        if item == "bad":
            raise RuntimeError("boom")
        stamped.append(item)

    ends = step_ends.StepEnds(finish, wait=lambda a: None)
    try:
        for item in ("a", "bad", "b"):
            ends.put(item, [])
        assert ends.drain(5)
    finally:
        ends.close()
    assert stamped == ["a", "b"]
    assert "boom" in capsys.readouterr().err


def test_drain_gives_up_at_its_deadline_while_a_step_still_runs():
    go = threading.Event()
    ends = step_ends.StepEnds(lambda item, end: None, wait=lambda a: go.wait(5))
    try:
        ends.put("x", [])
        assert ends.drain(0.05) is False
        go.set()
        assert ends.drain(5) is True
    finally:
        go.set()
        ends.close()
    assert ends._thread is None


def test_a_wait_for_the_steps_own_result_stamps_its_end_and_keeps_the_record_for_later():
    now, result = [1.0], object()
    rec = arrivals.Recorder(
        clock=lambda: now[0],
        spans=lambda r: True,
        unfinished=lambda: [result],
        ready=lambda arrays: True,
        background=True,
    )
    try:
        rec.on_call()
        rec.on_return("x")
        rec.before_call(wait=True)  # result.block_until_ready()
        now[0] = 2.0
        rec.after_call(result)  # ... returned: the step ended now
        now[0] = 3.0
        assert rec.steps == []  # the record is not made on the loop's path
        rec.on_call()
        rec.on_return("x")  # made once the next step is dispatched, with the end of then
        assert [(s["step"], s["end"]) for s in rec.steps] == [(0, 2.0)]
        assert rec.ends._thread is None
    finally:
        rec.close()


def test_a_wait_for_something_else_leaves_a_running_step_to_the_thread():
    go, result, other = threading.Event(), object(), object()
    rec = arrivals.Recorder(
        spans=lambda r: True,
        unfinished=lambda: [result],
        wait=lambda arrays: go.wait(5),
        ready=lambda arrays: go.is_set(),
        background=True,
    )
    try:
        rec.on_call()
        rec.on_return("x")
        rec.before_call(wait=True)  # print(other)
        rec.after_call(other)
        assert rec.steps == [] and rec.ends._thread is not None
        go.set()
        assert rec.drain(5) and [s["step"] for s in rec.steps] == [0]
    finally:
        go.set()
        rec.close()
