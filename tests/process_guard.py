"""Refuse to start processes inside unit tests, with Python's audit hooks.

Every way Python starts a process (``subprocess``, ``os.system``, ``os.posix_spawn``,
``os.fork``, the ``os.spawn*`` and ``os.exec*`` families) raises an audit event before the
process exists. One hook, installed once per run, watches for those events while a
:class:`NoProcesses` guard is active: it raises :class:`ProcessStarted` in the caller, so the
process is never started, and remembers the attempt, so that a test which swallows the
exception still fails when the guard closes.

Only the thread that opened the guard and the threads started while it was open are watched.
A thread left behind by an earlier (live) test may still start processes; blaming the unit
test that happens to run at that moment would be a false alarm.
"""

from __future__ import annotations

import sys
import threading

#: The audit events that mean "a process is about to be started".
SPAWN_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.system",
        "os.posix_spawn",
        "os.fork",
        "os.forkpty",
        "os.spawn",
        "os.exec",
        "pty.spawn",
    }
)


class ProcessStarted(RuntimeError):
    """A process was about to be started where none may be."""


class NoProcesses:
    """A context in which starting a process raises :class:`ProcessStarted`.

    Guards nest: the innermost open guard is the one that records an attempt.

    Parameters
    ----------
    where : str
        What is guarded (a test's node id), named in the error.

    Attributes
    ----------
    attempts : list of str
        One line per refused attempt: the audit event and its arguments.
    """

    _open: list[NoProcesses] = []
    _hooked = False

    def __init__(self, where: str):
        self.where = where
        self.attempts: list[str] = []
        self._old_threads: set[int] = set()

    def __enter__(self) -> NoProcesses:
        if not NoProcesses._hooked:
            sys.addaudithook(_hook)  # hooks cannot be removed: one for the whole run
            NoProcesses._hooked = True
        me = threading.get_ident()
        self._old_threads = {t.ident for t in threading.enumerate() if t.ident != me}
        NoProcesses._open.append(self)
        return self

    def __exit__(self, *exc) -> None:
        NoProcesses._open.remove(self)

    def watches_this_thread(self) -> bool:
        """Whether the calling thread is the guarded one or was started under the guard."""
        return threading.get_ident() not in self._old_threads

    def refuse(self, event: str, args: tuple) -> None:
        """Record an attempt and raise :class:`ProcessStarted` naming it."""
        what = f"{event}{_short(args)}"
        self.attempts.append(what)
        raise ProcessStarted(
            f"{self.where} started a process ({what}); a test that starts processes "
            "belongs in tests/live/ (or tests/browser/ when it drives chromium)"
        )


def _short(args: tuple) -> str:
    text = repr(args)
    return text if len(text) <= 300 else text[:297] + "..."


def _hook(event: str, args: tuple) -> None:
    # Called for every audit event in the process (opens, imports, ...): stay cheap.
    if event not in SPAWN_EVENTS or not NoProcesses._open:
        return
    guard = NoProcesses._open[-1]
    if guard.watches_this_thread():
        guard.refuse(event, args)
