"""When this process arrives at each step, and where its time went before it: the straggler
view's engine side.

While switched on (:func:`enable`), every call a cell's own code makes to a jitted function
whose first argument spans processes is one step: the recorder notes when the host began the
work leading to it (the previous call returned, or the cell began), the time spent in the
input pipeline (:func:`note_input`) and compiling (JAX's compile-duration events) and when
the call was made. The step's end is when its result is computed: read from the names the
cell's line stores it in (``state, loss = step(state, batch)``), or else the arrays this
process is still computing at its return, stamped by a thread of its own (:mod:`.step_ends`)
so that a loop keeps dispatching ahead of its devices.

A loop that dispatches ahead queues its steps on the devices: a step can begin only once
the host made the call *and* the previous step ended. So a record's ``start`` is the later
of the host's start and the previous step's end, and its ``dispatch`` no earlier than that.
Time spent waiting for the others inside a collective is then counted inside the step, not
in the next step's host time, whether or not the loop reads its results.

A loop that waits for each step (``w.block_until_ready()``, ``print(loss)``, ``float(loss)``)
stamps the end itself: the step's arrays are taken as the wait is called, while the devices
work, and the end is read on the main thread when the wait returns, so the thread does not
wake twice a step. Only waits seen returning count (calls into C: an array's
``block_until_ready``, ``float``, ``int``, ``print``, ``numpy.asarray``; a Python function
such as ``jax.block_until_ready`` gives no return to see). Anything else the cell calls
while a step still runs hands the step to the thread, so a step that ends while the host is
busy elsewhere is still stamped when it ended.

The calls are seen through Python's own monitoring (:mod:`sys.monitoring`, a ``CALL`` event
per call site and ``C_RETURN``), switched off at the first look for every call site outside a
cell, so library code costs one look per site. The records stay in this process (at most
:data:`MAX_STEPS` per cell) until the kernel reads them (:func:`records`) for ``%jaxsys
where``; the kernel checks them as untrusted input (``cells/step_records.py``).

A fault palette for teaching and testing the view: :func:`slow` delays this process before
each step's dispatch, in host code, in the input pipeline's account, or in its compute
(after the dispatch is stamped, before the call goes on, as a busy device would hold it).
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
import time
from collections.abc import Callable

from IPython import get_ipython

from . import step_calls
from .state import STATE
from .step_ends import StepEnds, arrays_ready, wait_arrays

# Steps kept per cell; later ones are counted in ``dropped``.
MAX_STEPS = 100_000
# Longest injected delay, in milliseconds (a minute).
MAX_DELAY_MS = 60_000
# Seconds records() waits for the ends of steps still running when the kernel asks.
DRAIN_SECONDS = 3.0
WHERE = ("host", "input", "compute")
# What each step record holds, in the order the recorder keeps it.
_FIELDS = ("kind", "step", "start", "dispatch", "end", "input", "compile", "compute")
_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_TOOL_NAME = "jaxsys-arrivals"


_KERNEL_CELL = f"{os.sep}ipykernel_"


def _is_cell_file(filename: str) -> bool:
    return filename.startswith("<ipython-input") or _KERNEL_CELL in filename


def _is_jitted(fn) -> bool:
    return type(fn).__name__ == "PjitFunction"


class Recorder:
    """One process's step records for the running cell.

    Parameters
    ----------
    clock : callable
        Wall clock in seconds (the kernel corrects it by the measured offset).
    spans : callable
        ``spans(arg)``: whether a call's first argument spans processes (a step).
    unfinished : callable
        ``unfinished()``: the arrays a step's end waits for, taken as its call returns.
    wait : callable
        ``wait(arrays)``: returns once they are computed.
    ready : callable
        ``ready(arrays)``: whether they are computed already, without waiting.
    sleep : callable
        Used for injected delays.
    background : bool
        Whether the ends are awaited on a thread of their own (:class:`.step_ends.StepEnds`)
        or at once, on the caller's thread.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        spans: Callable = step_calls.spans_processes,
        unfinished: Callable[[], list] = step_calls.unfinished,
        wait: Callable[[list], None] = wait_arrays,
        ready: Callable[[list], bool] = arrays_ready,
        sleep: Callable[[float], None] = time.sleep,
        background: bool = False,
    ):
        self.clock, self.spans, self.sleep = clock, spans, sleep
        self.unfinished, self.wait, self.ready = unfinished, wait, ready
        # Each step's record as a tuple of _FIELDS, made a dict only when read (steps):
        # a dict built per step cost the loop more than the rest of the record.
        self._rows: list[tuple] = []
        self.dropped = 0
        self.delay: tuple[float, str] | None = None
        self._depth = 0
        self._cell = 0
        # ids of the arrays handed over with steps whose end is still awaited
        self._held: set[int] = set()
        # The step just returned, kept on this thread until the cell's next call says
        # whether it waits for it (one of step_calls.waits()) or goes on (it goes to the thread).
        self._pending: list | None = None
        self._waiting = False
        # The thread stamping ends appends records while the main thread begins cells.
        self._lock = threading.Lock()
        self.ends = StepEnds(self._finish, wait, clock) if background else None
        self.begin_cell()

    def begin_cell(self) -> None:
        """Start a cell: no steps yet, its work begins now."""
        self._pending, self._waiting = None, False
        with self._lock:
            self._rows, self.dropped, self._depth = [], 0, 0
            self._cell += 1  # ends still awaited from an earlier cell are not its steps
            self._start = self._end = self.clock()
            self._input = self._compile = self._compute = 0.0
            self._dispatch = None

    @property
    def steps(self) -> list[dict]:
        """The current cell's step records, oldest first."""
        return [dict(zip(_FIELDS, row, strict=True)) for row in list(self._rows)]

    def note_input(self, seconds: float) -> None:
        """Count ``seconds`` of the current step's work as the input pipeline's."""
        if seconds > 0:
            self._input += seconds

    def note_compile(self, seconds: float) -> None:
        """Count ``seconds`` of compiling inside the current call."""
        if self._depth and seconds > 0:
            self._compile += seconds

    def on_call(self) -> None:
        """A cell's line calls a jitted function: the dispatch begins."""
        self._depth += 1
        if self._depth > 1:
            return  # a call traced inside another: part of the outer one's compile
        self.settle()
        if self.delay is not None:
            seconds, where = self.delay
            if where in ("host", "input"):
                self.sleep(seconds)
                if where == "input":
                    self.note_input(seconds)
        self._dispatch = self.clock()
        self._compile = self._compute = 0.0
        if self.delay is not None and self.delay[1] == "compute":
            # Held before the call goes on, as a busy device holds the collective: the
            # others wait for it inside the step, and it is counted as this step's compute.
            self.sleep(self.delay[0])
            self._compute = self.delay[0]

    def on_return(self, result, stored: Callable[[], list | None] | None = None) -> None:
        """The call returned: record a step if its first argument ``result`` spans processes
        (None when it raised). ``stored()``, asked once the cell's next line runs, gives the
        arrays the call stored (:func:`.step_calls.stored_arrays`), or None when it cannot tell.
        """
        self._depth = max(0, self._depth - 1)
        if self._depth or self._dispatch is None:
            return
        dispatch, self._dispatch = self._dispatch, None
        if result is None:
            return
        item = (self._cell, min(self._start, dispatch), dispatch, self._input, self._compile)
        item += (self._compute,)
        if self.ends is not None:
            # Looked at when the cell's next call says whether it waits (settle): the look
            # then runs while the devices work, and a loop that waits stamps the end itself.
            self._pending = [item, result, (self._start, self._input), None, stored]
            self._start, self._input = self.clock(), 0.0
            return
        if not self.spans(result):
            return
        arrays = self._hand_over()
        self._start, self._input = self.clock(), 0.0
        self.wait(arrays)
        self._finish(item + (tuple(id(a) for a in arrays),), self.clock())

    def _hand_over(self, stored: Callable[[], list | None] | None = None) -> list:
        """The arrays the step's end waits for that no earlier step holds, now held by this
        one: those the call stored when ``stored`` can tell (computed or not: the wait for
        one already computed returns at once), else any this process is still computing."""
        made = stored() if stored is not None else None
        if made is None:
            made = self.unfinished()
        # Each array is handed over once, with the step that made it: held by every later
        # step too, arrays the loop dropped would stay allocated while the host runs ahead.
        arrays = [a for a in made if id(a) not in self._held]
        self._held.update(id(a) for a in arrays)
        return arrays

    def _look(self) -> bool:
        """Whether the step kept here is one (its argument spans), its arrays now taken."""
        pending = self._pending
        if pending[3] is None:
            if not self.spans(pending[1]):
                self._start, self._input = pending[2]  # not a step: its host time goes on
                self._pending = None
                return False
            pending[1] = None  # the argument is not held past this look
            pending[3] = self._hand_over(pending[4])
            pending[4] = None  # nor is the cell's frame
        return True

    def pending(self) -> bool:
        """Whether a step that returned is kept here, its end not yet decided."""
        return self._pending is not None

    def before_call(self, wait: bool) -> None:
        """The cell calls something other than a jitted function (``wait``: one that
        returns once an array is computed, :func:`.step_calls.waits`)."""
        if self._pending is None:
            return
        if not wait:
            self.settle()
        elif self._look():
            self._waiting = True  # its end is read when the wait returns (after_call)

    def after_call(self) -> None:
        """A call into C from the cell returned: the end of a step it waited for is now."""
        if self._waiting:
            self.settle()

    def settle(self) -> None:
        """End the step kept here now if it is computed, or hand it to the thread.

        Steps end in order, so one is stamped here only while the thread has none left. Its
        arrays are looked at only after a wait (:func:`.step_calls.waits`): anywhere else,
        a step with arrays still running at its call's return goes to the thread.
        """
        waited, self._waiting = self._waiting, False
        if self._pending is None or not self._look():
            return
        item, arrays = self._pending[0], self._pending[3]
        self._pending = None
        item += (tuple(id(a) for a in arrays),)
        if self.ends.idle() and (not arrays or (waited and self.ready(arrays))):
            self._finish(item, self.clock())
        else:
            self.ends.put(item, arrays)

    def _finish(self, item: tuple, end: float) -> None:
        """Keep one step's record, now that its end is known (steps come in order)."""
        cell, host_start, dispatch, input_, compile_, compute, held = item
        # Before the arrays are let go, so that no new array can reuse one of these ids.
        self._held.difference_update(held)
        with self._lock:
            if cell != self._cell:
                return
            # Queued behind the previous step, a step begins when that one ended.
            start = max(host_start, self._end)
            dispatch = max(dispatch, start)
            self._end = end = max(end, dispatch)
            rows = self._rows
            if len(rows) < MAX_STEPS:
                rows.append(
                    (
                        "step",
                        len(rows) + self.dropped,
                        start,
                        dispatch,
                        end,
                        min(input_, dispatch - start),
                        compile_,
                        compute,
                    )
                )
            else:
                self.dropped += 1

    def drain(self, timeout: float = DRAIN_SECONDS) -> bool:
        """Wait up to ``timeout`` s for the ends of steps still running; whether all came."""
        if self.ends is None:
            return True
        self.settle()
        return self.ends.drain(timeout)

    def close(self) -> None:
        """Stop the thread stamping ends."""
        if self.ends is not None:
            self.ends.close()


def _tool_id() -> int | None:
    mon = sys.monitoring
    for tool in range(6):  # ids 0-5 are free for tools; 6 and 7 are reserved
        if mon.get_tool(tool) in (None, _TOOL_NAME):
            return tool
    return None


def _callbacks(rec: Recorder, waits: tuple):
    mon = sys.monitoring

    def on_call(code, _offset, fn, _arg0):
        if not _is_cell_file(code.co_filename):
            return mon.DISABLE
        if _is_jitted(fn):
            rec.on_call()
        elif rec.pending():
            # Asked only while a step waits for its end: most of a cell's calls come when
            # none does, and each is on the cell's own path.
            rec.before_call(step_calls.is_wait(fn, waits))
        return None

    # C_RETURN passes the call's first argument, not its result: a step is a call whose
    # first argument spans processes (a training step's state or batch does), and its end
    # is when every array still being computed is ready (see step_calls.unfinished).
    def on_c_return(code, offset, fn, arg0):
        if not _is_cell_file(code.co_filename):
            return
        if _is_jitted(fn):
            # The result is read from where the cell's line stores it, once stored.
            frame = sys._getframe(1)
            rec.on_return(arg0, lambda: step_calls.stored_arrays(frame, code, offset))
        else:
            rec.after_call()

    def on_c_raise(code, _offset, fn, _exc):
        if not _is_cell_file(code.co_filename):
            return
        if _is_jitted(fn):
            rec.on_return(None)
        else:
            rec.after_call()

    return on_call, on_c_return, on_c_raise


def _on_compile_event(event: str, duration: float, **_kwargs) -> None:
    rec = STATE.arrivals
    if rec is not None and event in _COMPILE_EVENTS:
        rec.note_compile(duration)


def _pre_run_cell(_info) -> None:
    if STATE.arrivals is not None:
        STATE.arrivals.begin_cell()


def _post_run_cell(_result) -> None:
    # A step the cell's last line left running goes to the thread now, not when read.
    if STATE.arrivals is not None:
        STATE.arrivals.settle()


def enable() -> str:
    """Record this process's steps in every later cell; says whether it could."""
    if STATE.arrivals is not None:
        return "on"
    tool = _tool_id()
    if tool is None:
        return "every monitoring tool id is taken by another tool"
    import jax.monitoring  # Deferred: switched on by the user, after JAX has started.

    # Whether the newest live array comes first is checked, not assumed (see unfinished).
    rec = Recorder(background=True)
    # The arrays earlier steps hold are passed over (the set is the recorder's own, kept up
    # to date as steps are handed over and end).
    rec.unfinished = functools.partial(
        step_calls.unfinished, newest_first=step_calls.newest_first(), held=rec._held
    )
    STATE.arrivals = rec
    atexit.register(rec.close)  # before JAX's own exit: no thread left waiting inside it
    mon = sys.monitoring
    mon.use_tool_id(tool, _TOOL_NAME)
    on_call, on_c_return, on_c_raise = _callbacks(rec, step_calls.waits())
    mon.register_callback(tool, mon.events.CALL, on_call)
    mon.register_callback(tool, mon.events.C_RETURN, on_c_return)
    mon.register_callback(tool, mon.events.C_RAISE, on_c_raise)
    mon.set_events(tool, mon.events.CALL | mon.events.C_RETURN | mon.events.C_RAISE)
    jax.monitoring.register_event_duration_secs_listener(_on_compile_event)
    shell = get_ipython()
    if shell is not None:
        shell.events.register("pre_run_cell", _pre_run_cell)
        shell.events.register("post_run_cell", _post_run_cell)
    return "on"


def disable() -> str:
    """Stop recording and drop the records and any injected delay."""
    mon = sys.monitoring
    for tool in range(6):
        if mon.get_tool(tool) == _TOOL_NAME:
            mon.set_events(tool, 0)
            mon.free_tool_id(tool)
    if STATE.arrivals is not None:
        import jax.monitoring  # Deferred: as in enable().

        jax.monitoring.unregister_event_duration_listener(_on_compile_event)
        shell = get_ipython()
        if shell is not None:
            shell.events.unregister("pre_run_cell", _pre_run_cell)
            shell.events.unregister("post_run_cell", _post_run_cell)
        STATE.arrivals.close()
        atexit.unregister(STATE.arrivals.close)
        STATE.arrivals = None
    return "off"


def records(last: int = MAX_STEPS) -> dict:
    """The last cell's latest ``last`` step records, and how many were left out."""
    rec = STATE.arrivals
    if rec is None:
        return {"on": False, "steps": [], "dropped": 0}
    last = max(0, min(int(last), MAX_STEPS))
    # Steps the cell left running end within DRAIN_SECONDS or are read at the next look.
    rec.drain()
    steps = rec.steps
    kept = steps[-last:] if last else []
    return {"on": True, "steps": kept, "dropped": rec.dropped + len(steps) - len(kept)}


def slow(ms: float | None, where: str = "host") -> str:
    """Delay this process by ``ms`` milliseconds before each step (None: no more delay)."""
    if ms is None:
        if STATE.arrivals is not None:
            STATE.arrivals.delay = None
        return "no delay"
    if where not in WHERE:
        raise ValueError(f"--in takes one of {', '.join(WHERE)}, not {where!r}")
    if not 0 < ms <= MAX_DELAY_MS:
        raise ValueError(f"--ms must be above 0 and at most {MAX_DELAY_MS}, not {ms}")
    enable()
    STATE.arrivals.delay = (ms / 1e3, where)
    return f"{ms:g} ms in {where} before each step"


__all__ = [
    "MAX_STEPS",
    "WHERE",
    "Recorder",
    "disable",
    "enable",
    "records",
    "slow",
]
