"""The straggler view's engine side: step records from a fake clock, and from real calls."""

from __future__ import annotations

import threading

import pytest

from jaxsys_kernel.cells.step_records import checked
from jaxsys_kernel.cells.stragglers import Stragglers
from jaxsys_kernel.engine import arrivals, step_calls, step_ends, step_recorder
from jaxsys_kernel.engine.state import STATE

pytestmark = pytest.mark.unit


class World:
    """Processes sharing one fake time line: a step ends when the last one dispatched."""

    def __init__(self, n, skew=()):
        self.now = 50.0
        self.skew = dict(enumerate(skew))
        self.local = dict.fromkeys(range(n), 0.0)
        self.recs = [self._recorder(r) for r in range(n)]

    def _recorder(self, r):
        def sleep(s):
            self.local[r] += s

        return arrivals.Recorder(
            clock=lambda: self.now + self.local[r] + self.skew.get(r, 0.0),
            spans=lambda result: True,
            unfinished=list,
            sleep=sleep,
        )

    def step(self, host=0.003, device=0.05):
        self.local = dict.fromkeys(range(len(self.recs)), host)
        for rec in self.recs:
            rec.on_call()
        arrived = max(self.local.values())
        self.local = dict.fromkeys(self.local, arrived + device)
        for rec in self.recs:
            rec.on_return("result")
        self.now += arrived + device


def test_a_host_delay_becomes_records_that_name_the_process_and_category():
    world = World(3, skew=(0.0, 40.0, -7.0))
    world.recs[1].delay = (0.2, "host")
    for _ in range(5):
        world.step()
    view = Stragglers(range(3), offsets={1: 40.0, 2: -7.0})
    for r, rec in enumerate(world.recs):
        assert [s["step"] for s in rec.steps] == list(range(5))
        for s in rec.steps:
            assert checked(s)
            view.add(r, s)
    assert view.named() == (1, "host")
    assert view.findings[-1].parts[0]["wait"] == pytest.approx(0.2, abs=1e-6)


@pytest.mark.parametrize("where", ["input", "compute"])
def test_input_and_compute_delays_are_counted_in_their_category(where):
    world = World(2)
    world.recs[0].delay = (0.1, where)
    for _ in range(3):
        world.step()
    view = Stragglers([0, 1])
    for r, rec in enumerate(world.recs):
        for s in rec.steps:
            view.add(r, s)
    assert world.recs[0].steps[-1][where] == pytest.approx(0.1)
    assert view.named() == (0, where)


def test_nested_calls_local_results_and_raises_are_not_steps():
    rec = arrivals.Recorder(clock=lambda: 1.0, spans=lambda r: r == "wide", unfinished=list)
    rec.on_call()
    rec.on_call()  # traced inside the first
    rec.on_return("wide")
    rec.on_return("local")
    rec.on_call()
    rec.on_return(None)  # raised
    assert rec.steps == []
    rec.on_call()
    rec.on_return("wide")
    assert [s["step"] for s in rec.steps] == [0]


def test_steps_per_cell_are_bounded(monkeypatch):
    monkeypatch.setattr(step_recorder, "MAX_STEPS", 3)
    rec = arrivals.Recorder(clock=lambda: 1.0, spans=lambda r: True, unfinished=list)
    for _ in range(5):
        rec.on_call()
        rec.on_return("x")
    assert len(rec.steps) == 3 and rec.dropped == 2
    rec.begin_cell()
    assert rec.steps == [] and rec.dropped == 0


def test_slow_refuses_bad_delays_with_the_flag_named():
    with pytest.raises(ValueError, match="--in takes one of host, input, compute"):
        arrivals.slow(10, "disk")
    with pytest.raises(ValueError, match="--ms"):
        arrivals.slow(0)
    with pytest.raises(ValueError, match="--ms"):
        arrivals.slow(10**9)


def _cell_steps(monkeypatch, code: str) -> list[dict]:
    """Run ``code`` as a cell's code with the records on; the steps it recorded, checked."""
    pytest.importorskip("jax")
    monkeypatch.setattr(arrivals, "_is_cell_file", lambda f: f == "<cell-under-test>")
    assert arrivals.enable() == "on"
    try:
        STATE.arrivals.spans = lambda result: True
        exec(compile(code, "<cell-under-test>", "exec"), {})
        return [checked(s) for s in arrivals.records()["steps"]]
    finally:
        arrivals.disable()


def test_real_jitted_calls_from_a_cell_are_seen_and_library_calls_are_not(monkeypatch):
    code = (
        "import jax, jax.numpy as jnp\n"
        "f = jax.jit(lambda x: (x * 2).sum())\n"
        "for i in range(3):\n"
        "    y = f(jnp.ones(8))\n"
    )
    steps = _cell_steps(monkeypatch, code)
    # jnp.ones is jitted inside JAX, not called from the cell: only f's three calls.
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert steps[0]["compile"] > 0 and steps[2]["compile"] == 0
    assert STATE.arrivals is None and arrivals.records() == {"on": False, "steps": [], "dropped": 0}


def test_steps_dispatched_ahead_begin_when_the_previous_step_ended():
    """Three calls queued in 20 ms run one after another on the devices: the host is not
    held at each call, and each step's start is the previous step's end (no host time)."""
    now = [0.0]
    go = threading.Event()
    order = iter(range(3))

    def wait(arrays):
        assert go.wait(5)
        now[0] = 1.0 + arrays[0]  # step i's devices finish at 1 + i s

    rec = arrivals.Recorder(
        clock=lambda: now[0],
        spans=lambda r: True,
        unfinished=lambda: [next(order)],
        wait=wait,
        ready=lambda arrays: go.is_set(),  # the devices finish only once let go
        background=True,
    )
    try:
        for i in range(3):
            now[0] = 0.01 * i
            rec.on_call()
            rec.on_return("x")
        assert rec.steps == []  # every call returned before any step ended
        go.set()
        assert rec.drain(5)
    finally:
        rec.close()
    steps = [checked(s) for s in rec.steps]
    assert [(s["start"], s["dispatch"], s["end"]) for s in steps] == [
        (0.0, 0.0, 1.0),
        (1.0, 1.0, 2.0),
        (2.0, 2.0, 3.0),
    ]
    assert all(s["host"] == 0.0 for s in steps)


def test_a_step_still_running_when_the_next_cell_begins_is_not_that_cells():
    go = threading.Event()
    rec = arrivals.Recorder(
        spans=lambda r: True, unfinished=list, wait=lambda a: go.wait(5), background=True
    )
    try:
        rec.on_call()
        rec.on_return("x")
        rec.begin_cell()
        go.set()
        assert rec.drain(5)
        assert rec.steps == []
        rec.on_call()
        rec.on_return("x")
        assert rec.drain(5) and [s["step"] for s in rec.steps] == [0]
    finally:
        rec.close()
    assert rec.ends._thread is None


def test_waiting_passes_over_arrays_donated_or_failed_after_they_were_handed_over():
    jax = pytest.importorskip("jax")

    class Gone:
        def __init__(self, deleted, error=None):
            self.deleted, self.error, self.waited = deleted, error, False

        def is_deleted(self):
            return self.deleted

        def block_until_ready(self):
            if self.error:
                raise self.error
            self.waited = True

    donated, failed, live = Gone(True), Gone(False, jax.errors.JaxRuntimeError("gone")), Gone(False)
    step_ends.wait_arrays([donated, failed, live])
    assert live.waited and not donated.waited


def test_real_steps_dispatched_ahead_with_donation_are_all_recorded(monkeypatch):
    code = (
        "import jax, jax.numpy as jnp\n"
        "f = jax.jit(lambda w: jnp.tanh(w @ w) * 1e-3, donate_argnums=0)\n"
        "w = jnp.ones((256, 256))\n"
        "for i in range(4):\n"
        "    w = f(w)\n"
    )
    steps = _cell_steps(monkeypatch, code)
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert all(a["end"] <= b["start"] for a, b in zip(steps, steps[1:], strict=False))


def test_an_array_still_running_is_handed_over_with_its_own_step_only():
    """A loop far ahead would otherwise keep every dropped result allocated until the
    step that last saw it ends."""
    first, second = object(), object()
    live = [[first], [first, second]]
    handed = []
    go = threading.Event()

    def wait(arrays):
        handed.append(list(arrays))
        assert go.wait(5)

    rec = arrivals.Recorder(
        spans=lambda r: True,
        unfinished=lambda: live.pop(0),
        wait=wait,
        ready=lambda arrays: go.is_set(),
        background=True,
    )
    try:
        for _ in range(2):
            rec.on_call()
            rec.on_return("x")
        go.set()
        assert rec.drain(5)
    finally:
        rec.close()
    assert handed == [[first], [second]]
    assert rec._held == set()  # let go once their steps ended


def _fake(now, **kw):
    """A recorder on the thread path whose clock reads ``now[0]``."""
    kw.setdefault("spans", lambda r: True)
    return arrivals.Recorder(clock=lambda: now[0], background=True, **kw)


def test_a_step_the_cell_waits_for_ends_when_the_wait_returns_without_the_thread():
    now = [1.0]
    done = []
    rec = _fake(now, unfinished=lambda: ["result"], ready=lambda arrays: bool(done))
    try:
        rec.on_call()
        rec.on_return("x")
        rec.before_call(wait=True)  # w.block_until_ready() called at 1.0 ...
        now[0], done[:] = 1.5, [True]
        rec.after_call()  # ... returns at 1.5: the step ended then
        assert [(s["dispatch"], s["end"]) for s in rec.steps] == [(1.0, 1.5)]
        assert rec.ends._thread is None and rec._held == set()
    finally:
        rec.close()


def test_a_wait_that_returns_before_the_step_ends_hands_it_to_the_thread():
    now = [1.0]
    go = threading.Event()

    def wait(arrays):
        assert go.wait(5)
        now[0] = 3.0

    rec = _fake(now, unfinished=lambda: ["result"], ready=lambda arrays: False, wait=wait)
    try:
        rec.on_call()
        rec.on_return("x")
        rec.before_call(wait=True)  # print("epoch 1"): returns at once
        now[0] = 1.1
        rec.after_call()
        assert rec.steps == [] and rec.ends._thread is not None
        go.set()
        assert rec.drain(5)
        assert [s["end"] for s in rec.steps] == [3.0]
    finally:
        rec.close()


def test_any_other_call_while_a_step_runs_hands_it_to_the_thread_at_once():
    """A step that ends while the host is busy in, say, its input pipeline is stamped by
    the thread when it ends, not when the cell next looks."""
    now = [1.0]
    handed = []
    rec = _fake(
        now,
        unfinished=lambda: ["result"],
        wait=lambda arrays: handed.append(now[0]),
        ready=lambda arrays: False,  # still running
    )
    try:
        rec.on_call()
        rec.on_return("x")
        rec.before_call(wait=False)  # next(loader)
        assert rec.drain(5) and handed == [1.0]
    finally:
        rec.close()


def test_a_step_computed_by_the_next_call_ends_without_waking_the_thread():
    """Where a step runs within its own call (collectives on CPU), it is computed by the
    time the loop makes its next call: stamped there, as the thread would have at once."""
    now = [1.0]
    rec = _fake(now, unfinished=lambda: ["result"], ready=lambda arrays: True)
    try:
        for t in (1.0, 1.5):
            now[0] = t
            rec.on_call()
            rec.on_return("x")
        now[0] = 2.0
        rec.before_call(wait=False)
        assert [s["end"] for s in rec.steps] == [1.5, 2.0]
        assert rec.ends._thread is None
    finally:
        rec.close()


def test_a_call_that_is_not_a_step_leaves_the_host_time_running():
    now = [0.0]
    rec = _fake(now, spans=lambda r: r == "wide", unfinished=list)
    try:
        rec.on_call()
        rec.on_return("local")  # e.g. a jitted metric on this process's arrays only
        now[0] = 2.0
        rec.before_call(wait=False)
        now[0] = 3.0
        rec.on_call()
        rec.on_return("wide")
        assert rec.drain(5)
        assert [(s["start"], s["dispatch"]) for s in rec.steps] == [(0.0, 3.0)]
    finally:
        rec.close()


def test_real_steps_waited_for_in_the_loop_are_recorded_without_the_thread(monkeypatch):
    pytest.importorskip("jax")
    monkeypatch.setattr(arrivals, "_is_cell_file", lambda f: f == "<cell-under-test>")
    code = (
        "import jax, jax.numpy as jnp\n"
        "f = jax.jit(lambda w: jnp.tanh(w @ w) * 1e-3)\n"
        "w = jnp.ones((256, 256))\n"
        "for i in range(4):\n"
        "    w = f(w)\n"
        "    w.block_until_ready()\n"
    )
    assert arrivals.enable() == "on"
    try:
        STATE.arrivals.spans = lambda result: True
        exec(compile(code, "<cell-under-test>", "exec"), {})
        assert STATE.arrivals.ends._thread is None
        steps = [checked(s) for s in arrivals.records()["steps"]]
    finally:
        arrivals.disable()
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert all(s["dispatch"] <= s["end"] for s in steps)


def test_whether_a_call_spans_processes_looks_at_a_bounded_part_of_its_argument():
    jax = pytest.importorskip("jax")
    from jaxsys_kernel.engine import step_calls

    flattened = []

    class Node:
        def __init__(self, child):
            self.child = child

    jax.tree_util.register_pytree_node(
        Node, lambda n: (flattened.append(1) or [n.child], None), lambda _, c: Node(*c)
    )
    deep = jax.numpy.ones(2)
    for _ in range(10_000):
        deep = Node(deep)
    assert step_calls.spans_processes(deep) is False  # arrays of this process only
    assert len(flattened) <= step_calls._LOOK_NODES
    state = {f"layer{i}": {"w": jax.numpy.ones(2), "b": None} for i in range(1000)}
    assert step_calls.spans_processes((state, [1, "x"])) is False


def test_the_look_for_a_steps_arrays_stops_at_one_an_earlier_step_holds(monkeypatch):
    import jax

    class Running:
        def is_ready(self):
            return False

    # Newest first: this step's two results, then two arrays of steps still in flight.
    live = [Running(), Running(), Running(), Running()]
    monkeypatch.setattr(jax, "live_arrays", lambda: live)
    held = {id(live[2]), id(live[3])}
    assert step_calls.unfinished(newest_first=True, held=held) == live[:2]
    assert step_calls.unfinished(newest_first=False, held=held) == live[:2]
    assert step_calls.unfinished(newest_first=True) == live
