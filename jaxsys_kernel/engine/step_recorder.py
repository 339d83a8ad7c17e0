"""One process's step records: what :mod:`.arrivals` keeps for each step a cell makes.

:mod:`.arrivals` says what a step is and how its times are read; this module keeps them:
:class:`Recorder` takes the calls :mod:`.arrivals` sees and turns them into one record per
step, with its end stamped by the main thread where it can be, or by :mod:`.step_ends`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from . import step_calls
from .step_ends import StepEnds, arrays_ready, wait_arrays

# Steps kept per cell; later ones are counted in ``dropped``.
MAX_STEPS = 100_000
# Seconds records() waits for the ends of steps still running when the kernel asks.
DRAIN_SECONDS = 3.0
# What each step record holds, in the order the recorder keeps it.
_FIELDS = ("kind", "step", "start", "dispatch", "end", "input", "compile", "compute")


def _with_ids(item: tuple, arrays: list) -> tuple:
    """A step's item with the ids of the arrays its end waited for (let go at its end)."""
    return item + (tuple([id(a) for a in arrays]),)


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
        self._pending, self._waiting, self._stamped = None, False, None
        with self._lock:
            self._rows, self.dropped, self._depth = [], 0, 0
            self._cell += 1  # ends still awaited from an earlier cell are not its steps
            self._start = self._end = self.clock()
            self._input = self._compile = self._compute = 0.0
            self._dispatch = None

    @property
    def steps(self) -> list[dict]:
        """The current cell's step records, oldest first."""
        return self.latest(len(self._rows))[0]

    def latest(self, last: int) -> tuple[list[dict], int]:
        """The current cell's latest ``last`` step records, and how many it has kept."""
        rows = list(self._rows)  # the thread appends meanwhile
        kept = rows[-last:] if last > 0 else []
        return [dict(zip(_FIELDS, row, strict=True)) for row in kept], len(rows)

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
        if self._pending is not None:
            self.settle()  # a step stamped already is kept after this dispatch (_flush)
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
        self._flush()  # the devices work on this call now: the host is off their path
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
        self._finish(_with_ids(item, arrays), self.clock())

    def _hand_over(self, stored: Callable[[], list | None] | None = None) -> list:
        """The arrays the step's end waits for that no earlier step holds, now held by this
        one: those the call stored when ``stored`` can tell (computed or not: the wait for
        one already computed returns at once), else any this process is still computing."""
        made = stored() if stored is not None else None
        if made is None:
            made = self.unfinished()
        # Each array is handed over once, with the step that made it: held by every later
        # step too, arrays the loop dropped would stay allocated while the host runs ahead.
        held = self._held
        arrays = [a for a in made if id(a) not in held]
        held.update([id(a) for a in arrays])
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

    def after_call(self, arg0=None) -> None:
        """A call into C from the cell returned (its first argument ``arg0``): the end of a
        step it waited for is now."""
        if not self._waiting:
            return
        end = self.clock()
        pending = self._pending
        arrays = pending[3]
        if arrays and any(a is arg0 for a in arrays) and self.ends.idle():
            # It waited for the step's own result, so the step is computed (its outputs come
            # from one execution). The rest is done after the next dispatch (_flush): here
            # the devices wait for the host, and right after a computation the host runs
            # slowly while the runtime's threads spin down (measured with 6.5 ms steps: a
            # median of 70-88 us here for the whole record, 25 us for what is left).
            self._waiting, self._pending = False, None
            self._stamped = (pending[0], arrays, end)
            return
        self.settle(end)

    def _flush(self) -> None:
        """Keep the record of a step stamped by after_call, now off the loop's path."""
        stamped, self._stamped = self._stamped, None
        if stamped is not None:
            item, arrays, end = stamped
            self._finish(_with_ids(item, arrays), end)

    def settle(self, end: float | None = None) -> None:
        """End the step kept here now if it is computed, or hand it to the thread.

        Steps end in order, so one is stamped here only while the thread has none left. A
        step whose arrays are computed already ends now, as the thread would stamp it at
        once, without waking it (each wake cost the thread 60-140 us of CPU with the devices
        busy, measured on 2 cores).
        """
        self._flush()
        self._waiting = False
        if self._pending is None or not self._look():
            return
        item, arrays = self._pending[0], self._pending[3]
        self._pending = None
        item = _with_ids(item, arrays)
        if self.ends.idle() and (not arrays or self.ready(arrays)):
            self._finish(item, end if end is not None else self.clock())
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


__all__ = ["DRAIN_SECONDS", "MAX_STEPS", "Recorder"]
