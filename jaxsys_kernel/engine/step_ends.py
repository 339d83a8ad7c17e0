"""When each recorded step's work is finished on the devices, stamped without holding the host.

A jitted call returns as soon as its work is queued; a loop that never reads its results
dispatches several steps ahead of its devices. The step recorder (:mod:`.arrivals`) needs
each step's end, but waiting for it on the main thread would stop that running ahead, which
costs the loop the overlap of host and device work (measured: 3-4 % of a 75 ms step at
8 processes on 2 cores). So the main thread hands each step's unfinished arrays to
:class:`StepEnds`, one thread that waits for them in order and stamps the end.

At most :data:`MAX_QUEUED` steps wait; a loop that far ahead waits for a place, so the arrays
held here stay bounded. An array donated to a later step is deleted before its wait: its
step's end is then stamped when the thread reaches it (the later step holds the devices
anyway), and a computation that failed ends its step when it failed.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

# Steps whose end is still awaited before the main thread waits for a place.
MAX_QUEUED = 256
_STOP = object()


def wait_arrays(arrays: list) -> None:
    """Wait until each array is computed; a deleted (donated) or failed one is passed over."""
    from jax.errors import JaxRuntimeError  # Deferred: only called once JAX has run a step.

    for a in arrays:
        try:
            if not a.is_deleted():
                a.block_until_ready()
        except JaxRuntimeError:
            # Donated after it was handed over, or its computation failed: either way
            # there is nothing left to wait for, and the step ends now.
            continue


def arrays_ready(arrays: list) -> bool:
    """Whether each array is computed now (a deleted or failed one counts as done)."""
    from jax.errors import JaxRuntimeError  # Deferred: as in wait_arrays.

    for a in arrays:
        try:
            if not a.is_deleted() and not a.is_ready():
                return False
        except JaxRuntimeError:
            continue
    return True


class StepEnds:
    """One thread that stamps each handed-over step's end once its arrays are ready.

    Parameters
    ----------
    finish : callable
        ``finish(item, end)``, called on the thread, in the order the steps were handed over.
    wait : callable
        ``wait(arrays)``: returns when the arrays are computed.
    clock : callable
        The wall clock the end is read from.
    limit : int
        Steps awaited at once before :meth:`put` waits for a place.
    """

    def __init__(
        self,
        finish: Callable,
        wait: Callable[[list], None] = wait_arrays,
        clock: Callable[[], float] = time.time,
        limit: int = MAX_QUEUED,
    ):
        self.finish, self.wait, self.clock = finish, wait, clock
        self._queue: queue.Queue = queue.Queue(maxsize=limit)
        self._thread: threading.Thread | None = None

    def put(self, item, arrays: list) -> None:
        """Hand over one step and the arrays its end waits for."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="jaxsys-step-ends", daemon=True)
            self._thread.start()
        self._queue.put((item, arrays))

    def _run(self) -> None:
        while True:
            got = self._queue.get()
            try:
                if got is _STOP:
                    return
                item, arrays = got
                self.wait(arrays)
                self.finish(item, self.clock())
                del arrays, got  # the arrays are not held past their step's end
            finally:
                self._queue.task_done()

    def idle(self) -> bool:
        """Whether every handed-over step is stamped already."""
        return self._queue.unfinished_tasks == 0

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every handed-over step to be stamped."""
        done = self._queue.all_tasks_done
        with done:
            return done.wait_for(lambda: self._queue.unfinished_tasks == 0, timeout)

    def close(self, timeout: float = 1.0) -> None:
        """Stop the thread once the steps before are stamped (waits up to ``timeout`` s)."""
        if self._thread is None:
            return
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            return  # a daemon thread: it goes with the process
        self._thread.join(timeout)
        self._thread = None


__all__ = ["MAX_QUEUED", "StepEnds", "arrays_ready", "wait_arrays"]
