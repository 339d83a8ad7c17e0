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
wake twice a step. The rest of the record is kept after the next dispatch: right after a
wait the devices wait for the host, and the host runs slowly while the runtime's threads
spin down. Only waits seen returning count (calls into C: an array's
``block_until_ready``, ``float``, ``int``, ``print``, ``numpy.asarray``; a Python function
such as ``jax.block_until_ready`` gives no return to see). Anything else the cell calls
while a step still runs hands the step to the thread, so a step that ends while the host is
busy elsewhere is still stamped when it ended; a step already computed by then ends there.
The records are kept by :class:`.step_recorder.Recorder`.

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

from IPython import get_ipython

from . import step_calls
from .state import STATE
from .step_recorder import MAX_STEPS, Recorder

# Longest injected delay, in milliseconds (a minute).
MAX_DELAY_MS = 60_000
WHERE = ("host", "input", "compute")
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
            rec.after_call(arg0)

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
    kept, count = rec.latest(last)
    return {"on": True, "steps": kept, "dropped": rec.dropped + count - len(kept)}


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
