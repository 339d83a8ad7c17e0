"""``%jaxsys watch NAME`` and ``%jaxsys unwatch``: a read-only view of a cluster that
another process owns (:mod:`jaxsys_kernel.cluster.watch`), and what a watcher may do.

A watching kernel keeps the :class:`~jaxsys_kernel.cluster.watch.Watched` cluster in
``session.watching``; while it is there, ``%jaxsys status`` and ``%jaxsys cache`` show that
cluster, and every command that would run code on its processes, stop or restart it is
refused with a message naming its owner and ``%jaxsys unwatch``.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from ..telemetry.memory import format_bytes
from . import commands

#: The ``%jaxsys`` actions a watcher may give: they read, and change nothing.
WATCHER_ACTIONS = frozenset({"watch", "unwatch", "status", "cache", "help"})
#: Seconds between two reads of a watched cluster by its live status.
REFRESH_S = 2.0


def refuse(session, what: str) -> None:
    """Raise the watcher's refusal of ``what`` when ``session`` is watching."""
    watched = getattr(session, "watching", None)
    if watched is not None:
        raise UsageError(watched.refusal(what))


@magic_arguments("jaxsys watch")
@argument("name", metavar="NAME", help="the cluster's name (jaxsys cluster start --name NAME)")
def watch(session, args: argparse.Namespace) -> None:
    """Watch a cluster that another process owns, read-only.

    ``NAME`` is the name ``jaxsys cluster start --name NAME`` gave it. The watcher reads
    the files the owner publishes and ``/proc``: ``%jaxsys status`` lists the cluster's
    processes, each one's devices, state and memory as they are now, and the live numbers
    the owner writes every 2 s: compilation-cache hits and misses per process, the steps of
    its latest cell and the straggler named (said stale when the owner stops writing them);
    ``%jaxsys cache`` shows its compilation cache directory and the live hits. It sends
    the cluster nothing, takes no lease and starts no process, so any number of watchers
    leave the owner's cells as fast as they were.
    A watcher cannot run cells on the processes, stop or restart them: ``%%multihost``
    and those commands are refused, naming the owner. ``%jaxsys unwatch`` ends it.

    Examples
    --------
    ::

        %jaxsys watch training
        %jaxsys status
        %jaxsys unwatch
    """
    result = commands.call(session, "watch", options={"name": args.name})
    print(result.message)
    for line in result.log:
        print(line)


@magic_arguments("jaxsys unwatch")
def unwatch(session, args: argparse.Namespace) -> None:
    """Stop watching the cluster ``%jaxsys watch`` named; the cluster runs on.

    Examples
    --------
    ::

        %jaxsys unwatch
    """
    print(commands.call(session, "unwatch").message)


def show_cache(session) -> None:
    """``%jaxsys cache`` of a watcher: the watched cluster's cache directory, from disk,
    and the hits and misses the owner last published."""
    watched = session.watching
    summary = watched.cache()
    if summary is None:
        print(f"cache: none (cluster {watched.name!r} runs without a persistent cache)")
    else:
        at_least = "" if summary.complete else "at least "
        print(
            f"cache: {summary.path}: {at_least}{summary.entries} files, "
            f"{format_bytes(summary.size)} (read from the disk)"
        )
    for line in watched.live_lines():
        if not line.startswith("steps"):
            print(line)


class LiveStatus:
    """A watcher's ``%jaxsys status``: one display output, redrawn every ``period`` seconds
    while the kernel watches the same cluster and this is its newest status.

    It stops by itself at ``%jaxsys unwatch``, at a newer status, and once the owner is
    gone (nothing changes after that). Each refresh reads the owner's files (its state and
    its live numbers) and ``/proc``.

    Parameters
    ----------
    session : MultihostSession
        The watching session (``session.watching`` set).
    render : callable
        Returns the status text.
    period : float
        Seconds between refreshes.
    show : callable
        ``IPython.display.display`` (a test passes its own).
    """

    def __init__(self, session, render: Callable[[], str], period: float = REFRESH_S, show=display):
        self.session, self.render, self.period, self.show = session, render, period, show
        self.watched = session.watching
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None
        self.text = ""
        self.handle = None

    def start(self) -> LiveStatus:
        """Show the status now and keep it current from a thread; returns itself."""
        old = getattr(self.session, "live_status", None)
        if old is not None:
            old.stopped.set()
        self.session.live_status = self
        self.text = self.render()
        self.handle = self.show({"text/plain": self.text}, raw=True, display_id=True)
        self.thread = threading.Thread(target=self._run, name="jaxsys-watch", daemon=True)
        self.thread.start()
        return self

    def current(self) -> bool:
        """Whether this view still shows what the session watches."""
        return self.session.watching is self.watched and self.session.live_status is self

    def _run(self) -> None:
        while not self.stopped.wait(self.period) and self.current():
            try:
                text = self.render()
                if text != self.text:
                    self.text = text
                    self.handle.update({"text/plain": text}, raw=True)
            except Exception:  # noqa: BLE001 - a view that cannot refresh keeps its last text
                pass
            if not self.watched.owner_alive():
                return
