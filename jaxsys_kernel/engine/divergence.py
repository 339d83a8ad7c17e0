"""The divergence check's engine side: what this process dispatches, and where it is.

While a cell runs with the ``divergence`` hook, this process reports to the kernel, in the
cell's own output channel (``display_data`` of :data:`MIME`, taken off by the kernel before
anything is shown):

- ``dispatch``: every executable it runs that spans processes, in order: the function's
  name, its abstract arguments, their shardings, the executable's fingerprint, the
  processes its devices belong to, and the user's line that called it;
- ``where``: every quarter second, when it changes, the cell's line the main thread is at,
  whether it is inside JAX, and whether it is idle (no CPU time used), so that a process
  stuck in Python can be told from one still compiling.

The source is JAX's public ``jax_distributed_debug`` option: on the slow dispatch path (a
call that missed the C++ cache, which includes every call that compiles) JAX logs each
executable through Python logging at WARNING. A logger filter sees that record first. The
arguments and shardings are read from the frame that logs it, a private detail of
``jax._src.pjit`` that :mod:`jaxsys_kernel._compat` reads, checked against the JAX version
(:func:`supported`); with another JAX version the check turns itself off and says so. What it cannot see: a call served by the
C++ cache (the same function on the same argument types as before), and the data.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

from IPython import get_ipython
from IPython.display import publish_display_data

from .. import _compat
from . import hooks
from .state import STATE

MIME = hooks.RECORD_MIME
# Seconds between two looks at where the main thread is.
SAMPLE = 0.25
# Seconds into a cell before the first look. A look is read only to tell a stuck process
# from a late one, a second after the others arrived (the kernel's WINDOW in
# cells/divergence.py), so one at half that is in time; each look sends the kernel a
# message through the controller, and at 64 processes on 2 cores, where a trivial cell
# takes about 0.25 s, a first look at SAMPLE sent one per process for most trivial cells.
FIRST_LOOK = 0.5
# Below this share of CPU time over one sample, the main thread counts as idle.
IDLE_SHARE = 0.05
# Seconds without a new cell after which the sampler stops polling and waits to be woken.
# Until then a cell begins without waking it: at 8 processes on 2 cores, a wake per cell
# (the sampler takes a core and the GIL while the reply is being sent) made a trivial cell
# 1-3 % slower; polling costs at most 1 / SAMPLE wakes a second, and only just after cells.
PARK = 2.0
# What one record carries at most: characters of a name, argument or sharding, and items
# of a list. The kernel refuses larger records (cells/divergence_records.py, whose bounds
# are wider), so a huge pytree or a generated name is cut here, the same way on every
# process, and the record still compares.
TEXT_LIMIT = 1000
ITEMS_LIMIT = 1000
# Path fragments of frames that are not the user's.
_LIBRARY = (os.sep + "jax" + os.sep, os.sep + "jaxlib" + os.sep, os.sep + "jaxsys_kernel" + os.sep)


def supported() -> str | None:
    """None when this JAX version's dispatch records can be read, else the reason why not."""
    # Deferred: the hooks load this module in engines that have imported JAX already; the
    # unit tests of its frame and logger logic run without JAX, which takes seconds to load.
    import jax

    return _compat.jax_dispatch_unsupported(jax.__version__)


def _is_cell_file(filename: str) -> bool:
    return filename.startswith("<ipython-input") or f"{os.sep}ipykernel_" in filename


def user_line(frame) -> int | None:
    """The line of the innermost frame of a cell's own code at or above ``frame``."""
    while frame is not None:
        if _is_cell_file(frame.f_code.co_filename):
            return frame.f_lineno
        frame = frame.f_back
    return None


def _short(aval) -> str:
    try:
        return aval.str_short(short_dtypes=True)
    except (AttributeError, TypeError):
        return type(aval).__name__


def _sharding_text(sharding) -> str:
    spec = getattr(sharding, "spec", None)
    if spec is not None:
        return str(spec)
    return type(sharding).__name__


def _processes(shardings) -> set[int]:
    procs: set[int] = set()
    for s in shardings:
        for d in getattr(s, "device_set", ()) or ():
            procs.add(d.process_index)
    return procs


def clip(text: str) -> str:
    """``text`` cut to :data:`TEXT_LIMIT` characters, saying how long it was."""
    if len(text) <= TEXT_LIMIT:
        return text
    rest = f"...({len(text)} characters in all)"
    return text[: TEXT_LIMIT - len(rest)] + rest


def clip_list(items: list[str]) -> list[str]:
    """``items`` cut to :data:`ITEMS_LIMIT` entries, the last saying how many were left out."""
    items = [clip(i) for i in items[:ITEMS_LIMIT]] + items[ITEMS_LIMIT:]
    if len(items) <= ITEMS_LIMIT:
        return items
    return items[: ITEMS_LIMIT - 1] + [f"...(+{len(items) - ITEMS_LIMIT + 1} more)"]


def describe(call: dict) -> dict | None:
    """A ``dispatch`` record from the call JAX logs, or None if it spans one process.

    ``call`` is what :func:`jaxsys_kernel._compat.jax_dispatch_call` read from JAX's frame.
    """
    import jax  # Deferred: as in supported().

    args = call["args"]
    arg_shardings = [getattr(a, "sharding", None) for a in args]
    declared = [*call["in_shardings"], *call["out_shardings"]]
    procs = _processes([s for s in arg_shardings + declared if s is not None])
    if len(procs) < 2 or jax.process_index() not in procs:
        return None
    return {
        "kind": "dispatch",
        "name": clip(str(call["name"])),
        "args": clip_list([_short(jax.typeof(a)) for a in args]),
        "shardings": clip_list([_sharding_text(s) for s in arg_shardings if s is not None]),
        "fingerprint": call["fingerprint"] or "",
        "procs": sorted(procs),
        "line": user_line(call["frame"]),
        "t": time.time(),
    }


class Recorder:
    """Reports this process's dispatches and position to the running cell.

    Parameters
    ----------
    publish : callable
        ``publish(record)``: sends one record to the cell (called from any thread).
    """

    def __init__(self, publish):
        self.publish = publish
        self.seq = 0
        self.active = False
        self.ours = False  # whether we turned jax_distributed_debug on
        self.thread = threading.current_thread()
        # The sampler is one thread for the process's life. It sleeps on an event between
        # cells and looks every SAMPLE seconds while one runs; a cell only sets flags, so
        # back-to-back cells cost it no thread start, join or wake-up (a thread started
        # and joined per cell cost each process 0.4 ms of CPU per cell: at 8 processes on
        # 2 cores a trivial cell took 2 ms longer than without the check).
        # Under the lock: whether a cell runs, whether the sampler waits on _wake (parked),
        # and when the last cell ended.
        self._running = False
        self._parked = False
        self._ended = 0.0
        self._wake = threading.Event()  # set to end the sampler's park
        # Held while a sample is taken and published, and while a cell begins or ends, so
        # that no sample of a cell is published after it.
        self._lock = threading.Lock()
        self._cell = 0  # counts the cells begun: a sample checks it is still its cell's
        # Where the current cell's CPU share is measured from: (the cell's thread's CPU
        # clock, its reading, the wall clock's), set as the cell begins; and when it began.
        self._since: tuple = (lambda: None, None, 0.0)
        self._began = 0.0
        self._sampler: threading.Thread | None = None
        self._clock: tuple = (None, lambda: None)  # (thread, its CPU clock)

    def filter(self, record: logging.LogRecord) -> bool:
        """A logger filter: record JAX's dispatch, and keep it out of the cell if ours."""
        if not _compat.is_jax_dispatch_record(record):
            return True
        if self.active:
            try:
                self._record(sys._getframe(1))
            except Exception as e:  # noqa: BLE001 - the check must never fail the user's dispatch
                self.active = False
                print(f"jaxsys: the divergence check stopped for this cell: {e!r}", file=sys.stderr)
        return not self.ours

    def _record(self, frame) -> None:
        call = _compat.jax_dispatch_call(frame)
        entry = describe(call) if call is not None else None
        if entry is not None:
            entry["seq"] = self.seq
            self.seq += 1
            self.publish(entry)

    def start(self) -> None:
        """Begin a cell: turn on JAX's dispatch records and the position sampler."""
        import jax  # Deferred: as in supported().

        self.seq = 0
        self.thread = threading.current_thread()
        self.ours = not jax.config.jax_distributed_debug
        if self.ours:
            jax.config.update("jax_distributed_debug", True)
        self.active = True
        # The clock of the cell's thread (almost always the same one) is looked up once.
        # Keyed by the thread itself: a later thread may get a dead one's ident.
        if self._clock[0] is not self.thread:
            self._clock = (self.thread, _thread_clock(self.thread))
        clock = self._clock[1]
        with self._lock:
            self._cell += 1
            self._began = time.monotonic()
            self._since = (clock, clock(), self._began)
            self._running = True
            if self._parked:
                self._parked = False
                self._wake.set()
        if self._sampler is None or not self._sampler.is_alive():
            self._sampler = threading.Thread(
                target=self._sample, name="jaxsys-divergence", daemon=True
            )
            self._sampler.start()

    def stop(self) -> None:
        """End the cell: records off, sampler idle, JAX's option as the user had it."""
        import jax  # Deferred: as in supported().

        self.active = False
        with self._lock:
            # A sample being taken finishes first; the next look sees no cell and idles.
            self._running = False
            self._ended = time.monotonic()
        if self.ours:
            jax.config.update("jax_distributed_debug", False)
            self.ours = False

    def where(self, cpu_share: float) -> dict:
        """Where the cell's thread is now: its line, whether inside JAX, whether idle."""
        frame = sys._current_frames().get(self.thread.ident)
        line, in_jax = None, False
        while frame is not None:
            name = frame.f_code.co_filename
            if _is_cell_file(name):
                line = frame.f_lineno
                break
            in_jax = in_jax or any(part in name for part in _LIBRARY[:2])
            frame = frame.f_back
        return {"kind": "where", "line": line, "in_jax": in_jax, "idle": cpu_share < IDLE_SHARE}

    def _sample(self) -> None:
        cell, last, looked = None, None, 0.0
        while True:
            with self._lock:
                now = time.monotonic()
                if self._running:
                    # A cell is first looked at FIRST_LOOK seconds in, then every SAMPLE.
                    due = max(self._began + FIRST_LOOK, looked + SAMPLE)
                elif now - self._ended < PARK:
                    due = now + SAMPLE  # a next cell may begin any moment: poll for it
                else:
                    self._parked = True
                    self._wake.clear()
                    due = None
            if due is None:
                cell, last = None, None
                self._wake.wait()  # set by start(), under the lock, once parked
                continue
            time.sleep(max(0.0, due - time.monotonic()))
            with self._lock:
                t = time.monotonic()
                if not self._running or t - self._began < FIRST_LOOK:
                    continue  # no cell, or another began while this look was due
                if self._cell != cell:
                    cell, last = self._cell, None
                looked = t
                clock, used, t0 = self._since
                now = clock()
                self._since = (clock, now, t)
                busy = now - used if now is not None and used is not None else None
                share = busy / (t - t0) if busy is not None and t > t0 else 1.0
                try:
                    rec = self.where(share)
                    if rec != last:
                        last = rec
                        self.publish({**rec, "t": time.time()})
                except Exception:  # noqa: BLE001 - a failed look must not print into the cell
                    return


def _thread_clock(thread: threading.Thread):
    """A function giving ``thread``'s CPU seconds (None where the system cannot tell)."""
    try:
        clock_id = time.pthread_getcpuclockid(thread.ident)
    except (AttributeError, OSError, TypeError):
        return lambda: None

    def read() -> float | None:
        try:
            return time.clock_gettime(clock_id)
        except OSError:
            return None

    return read


def _publisher():
    """A ``publish(record)`` bound to the current cell, usable from any thread."""
    shell = get_ipython()
    header = getattr(shell, "parent_header", None) or {}
    pub = getattr(shell, "display_pub", None)
    set_parent = getattr(pub, "set_thread_parent", None)

    def publish(record: dict) -> None:
        token = set_parent(header) if set_parent is not None else None
        try:
            publish_display_data({MIME: record})
        finally:
            if token is not None:
                pub.reset_thread_parent(token)

    return publish


def _before(_options: dict) -> Recorder | None:
    reason = supported()
    if reason is not None:
        print(f"jaxsys: {reason}", file=sys.stderr)
        return None
    if STATE.recorder is None:
        STATE.recorder = Recorder(_publisher())
        logging.getLogger(_compat.JAX_DISPATCH_LOGGER).addFilter(STATE.recorder.filter)
    STATE.recorder.publish = _publisher()
    STATE.recorder.start()
    return STATE.recorder


def _after(recorder: Recorder | None, _exc: BaseException | None = None) -> None:
    if recorder is not None:
        recorder.stop()


hooks.register(hooks.Hook("divergence", _before, _after, _after))

__all__ = ["MIME", "Recorder", "clip", "clip_list", "describe", "supported", "user_line"]
