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

import functools
import queue
import threading
import time
import traceback
from collections.abc import Callable

# Steps whose end is still awaited before the main thread waits for a place.
MAX_QUEUED = 256
_STOP = object()


@functools.cache
def _runtime_error() -> type:
    # Looked up once: an import statement at every step cost the thread a lookup each time.
    from jax.errors import JaxRuntimeError  # Deferred: only asked once JAX has run a step.

    return JaxRuntimeError


def wait_arrays(arrays: list) -> None:
    """Wait until each array is computed; a deleted (donated) or failed one is passed over."""
    failed = _runtime_error()
    for a in arrays:
        try:
            if not a.is_deleted():
                a.block_until_ready()
        except failed:
            # Donated after it was handed over, or its computation failed: either way
            # there is nothing left to wait for, and the step ends now.
            continue


def arrays_ready(arrays: list) -> bool:
    """Whether each array is computed now (a deleted or failed one counts as done)."""
    failed = _runtime_error()
    for a in arrays:
        try:
            if not a.is_deleted() and not a.is_ready():
                return False
        except failed:
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
        self.finish, self.wait, self.clock, self.limit = finish, wait, clock, limit
        # A queue written in C, with two counts beside it, each written by one thread only:
        # queue.Queue takes its locks and conditions in Python at every put and get, and
        # this runs once a step on both threads.
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._put = 0  # steps handed over (the caller's thread)
        self._done = 0  # steps stamped (this thread)
        # Set after each stamp while someone waits for a place or for the queue to empty.
        self._changed = threading.Event()
        self._watched = False
        self._thread: threading.Thread | None = None

    def put(self, item, arrays: list) -> None:
        """Hand over one step and the arrays its end waits for."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="jaxsys-step-ends", daemon=True)
            self._thread.start()
        if self._put - self._done >= self.limit:
            self._wait_until(lambda: self._put - self._done < self.limit, None)
        self._put += 1
        self._queue.put((item, arrays))

    def _run(self) -> None:
        while True:
            got = self._queue.get()
            if got is _STOP:
                return
            try:
                self.wait(got[1])
                self.finish(got[0], self.clock())
            except Exception:  # noqa: BLE001 - see below
                # One step's record is lost, not the thread: the steps after it still end.
                traceback.print_exc()
            del got  # the arrays are not held past their step's end
            self._done += 1
            if self._watched:
                self._changed.set()

    def idle(self) -> bool:
        """Whether every handed-over step is stamped already."""
        return self._done == self._put

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every handed-over step to be stamped."""
        return self._wait_until(self.idle, timeout)

    def _wait_until(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._watched = True
        try:
            # Cleared before each look: a stamp after the look sets it again, so no wake is lost.
            while True:
                self._changed.clear()
                if ready():
                    return True
                if self._thread is None or not self._thread.is_alive():
                    return False
                left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
                if left <= 0:
                    return False
                self._changed.wait(left)
        finally:
            self._watched = False

    def close(self, timeout: float = 1.0) -> None:
        """Stop the thread once the steps before are stamped (waits up to ``timeout`` s)."""
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None


__all__ = ["MAX_QUEUED", "StepEnds", "arrays_ready", "wait_arrays"]
