"""Async-first objects: coroutines that run on a private event-loop thread, with generated
blocking twins, and progress reported on the thread that asked.

The loop thread lives while its object has work that may need it: everything that launches
processes runs there, because the parent-death signal of an engine fires when the *thread*
that launched it exits (see ``profile.py``). An object whose processes are all gone (a
stopped cluster) ends its thread once nothing runs on it, and makes a new one if asked to
work again, so that a kernel starting cluster after cluster keeps no thread for each.
Progress events are queued by that thread and rendered by the caller, so a progress bar
lands in the notebook cell that asked for the work.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import queue
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from .front_end import progress_as_stream
from .records import ClusterError, ProgressEvent

LOOP_START_TIMEOUT = 10.0
# How often a waiting caller renders the progress queued meanwhile.
_PROGRESS_PERIOD = 0.05
# After an interrupt, how long the coroutine gets to clean up what it started.
_CANCEL_GRACE = 10.0


class AsyncFirst:
    """Base for classes whose public coroutines run on a private event-loop thread.

    For every public coroutine ``name`` of a subclass, ``__init_subclass__`` makes the
    coroutine run on the object's loop thread (the caller's own loop only waits for it and
    renders progress) and adds ``name_sync``, its blocking twin, unless the subclass writes
    that twin itself (then the coroutine is left as written).

    Parameters
    ----------
    progress : callable, optional
        Called with each :class:`ProgressEvent`, on the thread that called the method.
        Defaults to a progress line on stdout.
    """

    def __init__(self, progress: Callable[[ProgressEvent], None] | None = None):
        self._progress_cb = progress
        self._progress_q: queue.SimpleQueue[ProgressEvent] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        # Held while work is handed to the loop and while the loop decides to end, so that
        # nothing is handed to a loop that is ending; work handed over is counted.
        self._loop_lock = threading.Lock()
        self._handed = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, func in list(vars(cls).items()):
            if name.startswith("_") or not inspect.iscoroutinefunction(func):
                continue
            if getattr(func, "_jaxsys_on_loop", False) or f"{name}_sync" in vars(cls):
                continue
            setattr(cls, name, _on_loop(func))
            setattr(cls, f"{name}_sync", _blocking_twin(name, func))

    # -- the loop --------------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def main():
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()
                loop.close()

            # Must outlive every engine: the parent-death signal fires when this thread ends.
            t = threading.Thread(target=main, name="jaxsys-cluster-loop", daemon=True)
            t.start()
            if not started.wait(LOOP_START_TIMEOUT):
                raise ClusterError(
                    f"the cluster's event loop did not start within {LOOP_START_TIMEOUT:g} s"
                )
            self._loop, self._loop_thread = loop, t
        return self._loop

    def _submit(self, coro: Coroutine) -> concurrent.futures.Future:
        with self._loop_lock:
            self._handed += 1
            return asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())

    def _end_loop_when_idle(self) -> None:
        """End the loop thread if nothing runs on it by the time it looks (else keep it).

        Safe from any thread, the loop's own included. Only for an object none of whose
        processes is left: the thread's end fires the parent-death signal of every process
        it launched."""
        with self._loop_lock:
            loop, handed = self._loop, self._handed
        if loop is None or loop.is_closed():
            return

        def idle() -> bool:
            # On the loop, between callbacks: a task still pending is work under way, and
            # work handed over since the request may not have become a task yet.
            busy = any(not t.done() for t in asyncio.all_tasks(loop))
            return not busy and self._handed == handed and self._loop is loop

        def end_if_still_idle() -> None:
            with self._loop_lock:
                if not idle():
                    return
                self._loop = self._loop_thread = None
                self._loop_ended()
            loop.stop()

        def end_if_idle() -> None:
            # A task that has just ended hands its result to its caller in callbacks queued
            # behind this one; a stop now would drop them, and the caller would wait for
            # good. The end is decided again behind them.
            with self._loop_lock:
                if idle():
                    loop.call_soon(end_if_still_idle)

        try:
            loop.call_soon_threadsafe(end_if_idle)
        except RuntimeError:
            pass  # closed meanwhile

    def _loop_ended(self) -> None:
        """Called (on the loop, under its lock) as the loop thread ends: forget what was
        bound to that loop. Subclasses extend it."""

    def _after_call(self) -> None:
        """Called on the caller's thread once a coroutine it asked for has ended. Subclasses
        end the loop here (:meth:`_end_loop_when_idle`) when it has nothing left to keep."""

    def _run_sync(self, coro: Coroutine) -> Any:
        fut = self._submit(coro)
        try:
            # Waited for by its state, never by catching TimeoutError: since Python 3.11
            # that is the builtin one, so a coroutine that *raised* TimeoutError would look
            # unfinished, and each re-raise would lengthen its traceback without end.
            while not fut.done():
                concurrent.futures.wait([fut], timeout=_PROGRESS_PERIOD)
                self._drain_progress()
            self._drain_progress()
            return fut.result()
        except KeyboardInterrupt:
            # Let the coroutine clean up (it kills what it started) before re-raising.
            fut.cancel()
            try:
                fut.result(timeout=_CANCEL_GRACE)
            except BaseException:  # noqa: BLE001 - the interrupt is what we re-raise
                pass
            self._drain_progress()
            raise
        finally:
            finish_progress()
            self._after_call()

    async def _run_async(self, coro: Coroutine) -> Any:
        fut = asyncio.wrap_future(self._submit(coro))
        try:
            while not fut.done():
                await asyncio.wait([fut], timeout=_PROGRESS_PERIOD)
                self._drain_progress()
            return fut.result()
        finally:
            finish_progress()
            self._after_call()

    # -- progress --------------------------------------------------------------------------

    def _report(self, stage: str, done: int, total: int) -> None:
        self._progress_q.put(ProgressEvent(stage, done, total))

    def _drain_progress(self) -> None:
        while True:
            try:
                event = self._progress_q.get_nowait()
            except queue.Empty:
                return
            (self._progress_cb or default_progress)(event)


def _on_loop(func: Callable[..., Coroutine]) -> Callable[..., Coroutine]:
    @functools.wraps(func)
    async def run_on_loop(self: AsyncFirst, *args: Any, **kwargs: Any) -> Any:
        return await self._run_async(func(self, *args, **kwargs))

    run_on_loop._jaxsys_on_loop = True  # type: ignore[attr-defined]
    return run_on_loop


def _blocking_twin(name: str, func: Callable[..., Coroutine]) -> Callable[..., Any]:
    @functools.wraps(func)
    def twin(self: AsyncFirst, *args: Any, **kwargs: Any) -> Any:
        return self._run_sync(func(self, *args, **kwargs))

    twin.__name__ = f"{name}_sync"
    twin.__qualname__ = f"{func.__qualname__}_sync"
    twin.__doc__ = f"Blocking twin of :meth:`{name}`."
    return twin


# -- the default progress display: one tqdm line per stage, on stdout ------------------------
# Progress is not an error: on stderr a notebook would paint it as one. Each stage is one line
# that tqdm rewrites in place. In a terminal that is a carriage return. In a kernel a stream
# keeps every frame (nbclient, nbconvert and papermill save each as its own output), so there
# each bar is one display output updated in place by its display id: a live front end redraws
# it, and a saved notebook holds one output per bar, its final state.

_bars: dict[str, Any] = {}


class _DisplayLine:
    """A file for tqdm that shows what it writes as one display output, updated in place."""

    def __init__(self, display: Callable[..., Any]) -> None:
        self._display = display
        self._handle: Any = None

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip("\n")
        if not line:
            return
        bundle = {"text/plain": line}
        if self._handle is None:
            self._handle = self._display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)

    def flush(self) -> None:
        """Nothing is buffered."""


def _progress_file() -> Any:
    # ipykernel's stream sends every write as an output; anything else (a terminal, a
    # script, `jaxsys cluster start`) gets tqdm's carriage returns.
    if type(sys.stdout).__module__ != "ipykernel.iostream" or progress_as_stream():
        # A terminal front end (jupyter console) ignores display updates but draws a
        # stream's carriage returns: there the bar is one line, as in a shell.
        return sys.stdout
    # Deferred: only a kernel (which has imported IPython already) shows progress this way.
    from IPython.display import display

    return _DisplayLine(display)


def default_progress(event: ProgressEvent) -> None:
    """Show a progress event as one line, updated in place (one line per stage)."""
    # Deferred: tqdm takes a fifth of a second to import, and `jaxsys cluster status`
    # imports this module (through the cluster package) and never shows progress.
    from tqdm.std import tqdm

    bar = _bars.get(event.stage)
    if bar is None:
        finish_progress()
        _bars[event.stage] = tqdm(
            total=event.total,
            initial=event.done,
            desc=event.stage,
            bar_format="{desc} {n}/{total} [{elapsed}]",
            mininterval=0,
            file=_progress_file(),
        )
    elif bar.n != event.done:
        bar.n = event.done
        bar.refresh()


def finish_progress() -> None:
    """Close every open progress bar."""
    for stage in list(_bars):
        _bars.pop(stage).close()
