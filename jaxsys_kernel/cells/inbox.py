"""Where a cell's events wait between the client's IO thread and the kernel's main thread.

The IO thread receives every process's reply and output; the main thread feeds them to
the cell machine. Waking the main thread for each of them makes the two threads trade the
interpreter lock, and on a loaded machine each trade waits for a free core: at 64
processes a trivial cell spends more time in those trades than in any work. So output
(which the user waits to see) wakes the main thread at once, while the end of each
process's part (a reply, its idle status) wakes it only with the last one expected; any
other event waits at most :data:`LAG` seconds, as the main thread never sleeps longer.
"""

from __future__ import annotations

import collections
import queue
import threading

from ..cluster.reply_limit import OutputTooLarge

# The longest an event that did not wake the main thread waits to be taken.
LAG = 0.05
# The iopub messages the cell machine reads; the rest (status, execute_input, ...) never
# reach the main thread.
SHOWN = frozenset({"stream", "display_data", "execute_result", "error"})


class Events:
    """A queue of ``(rank, kind, payload)`` events, with a ``get`` like ``queue.Queue``'s.

    Parameters
    ----------
    expected : int
        How many ``reply`` and ``idle`` events make the cell complete (two per process).
    """

    def __init__(self, expected: int):
        self._items: collections.deque = collections.deque()
        self._ready = threading.Event()
        self._left = expected
        self._count = threading.Lock()

    def put(self, item: tuple, urgent: bool = True) -> None:
        """Add an event; ``urgent`` wakes the main thread now (see the module docstring)."""
        self._items.append(item)
        if urgent:
            self._ready.set()

    def put_end(self, item: tuple) -> None:
        """Add a ``reply`` or ``idle`` event: urgent only if it is the last one expected."""
        with self._count:
            self._left -= 1
            last = self._left <= 0
        self.put(item, urgent=last)

    def get(self, block: bool = True, timeout: float | None = None) -> tuple:
        """The oldest event, waiting up to ``timeout`` s (at most :data:`LAG`) for one.

        Raises
        ------
        queue.Empty
            None came in time.
        """
        if self._items:
            return self._items.popleft()
        if not block or timeout == 0:
            raise queue.Empty
        self._ready.clear()
        # An event put between the look above and the clear must not wait for the next.
        if not self._items:
            self._ready.wait(LAG if timeout is None else min(timeout, LAG))
        try:
            return self._items.popleft()
        except IndexError:
            raise queue.Empty from None


class Inbox:
    """Puts one process's events on the queue (runs on the client's IO thread)."""

    def __init__(self, events: Events, rank: int):
        self.events = events
        self.rank = rank

    def iopub(self, msg: dict) -> None:
        if msg["header"]["msg_type"] in SHOWN:
            self.events.put((self.rank, "iopub", msg))

    def reply(self, future) -> None:
        # A dead engine sends no idle status: the machine must hear of it now.
        if future.exception() is not None:
            self.events.put((self.rank, "reply", future))
        else:
            self.events.put_end((self.rank, "reply", future))

    def idle(self, future) -> None:
        error = future.exception()
        if isinstance(error, OutputTooLarge):
            # The process's output was cut short by the kernel's bound: said where it was cut.
            said = {"msg_type": "stream"}, {"name": "stderr", "text": f"{error}\n"}
            self.events.put((self.rank, "iopub", {"header": said[0], "content": said[1]}))
        self.events.put_end((self.rank, "idle", None))

    def attach(self, future) -> None:
        """Registered before the request is sent, so no output can slip past it."""
        future.iopub_callbacks.append(self.iopub)
        future.add_done_callback(self.reply)
        future.output.add_done_callback(self.idle)
