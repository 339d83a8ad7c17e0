"""Whether this machine's engines have ended, without reading ``/proc`` at every look.

A cell looks at every process it is for before it is sent, and again every quarter second
while it runs (the hub notices a death only after missed heartbeats). Reading
``/proc/PID/stat`` for that took about 5 us a process on an idle machine and 54 us while
a cell's processes were busy, 0.43 ms before each cell at 8 processes.

A pidfd (Linux 5.3 and later) becomes readable once its process has exited, zombie or
reaped, and stays bound to that process, so a pid the system hands out again cannot pass
for it. Looking at one takes under a microsecond. It is opened at a process's first look
and checked then against the start time the process reported, so it names the process
the cluster started and not a later one with the same pid. Where no pidfd can be opened
(another system, an old kernel, no file descriptor left), the look falls back to
:func:`~jaxsys_kernel.cluster.pids.pid_alive`.
"""

from __future__ import annotations

import os
import select
import threading

from .pids import pid_alive

# A start time read now and the one a process reported at registration may differ by the
# rounding of psutil's clock ticks.
START_SLACK_S = 0.05


# What _started says of a pid no process holds.
_GONE = -1.0


def _started(pid: int) -> float | None:
    """When the process ``pid`` started (psutil's create time); :data:`_GONE` when there is
    none, None when it cannot be told (then the pidfd is taken as naming ours)."""
    # Deferred: psutil is read once per process, at its first look.
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return _GONE
    except psutil.Error:
        return None


class ExitWatch:
    """A pidfd per watched process; :meth:`ended` says whether that process has exited.

    The look is ``poll``, not ``select``: a kernel with many sockets may hold descriptors
    past ``select``'s 1024.

    Parameters
    ----------
    limit : int
        The most pidfds held; beyond it the oldest is closed (and opened again if asked
        for), so the processes of earlier worlds do not hold descriptors for long.
    """

    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self._fds: dict[tuple[int, float | None], int] = {}
        self._lock = threading.Lock()
        self._usable = hasattr(os, "pidfd_open")

    def ended(self, pid: int, started: float | None = None) -> bool:
        """Whether the process ``pid`` that started at ``started`` (psutil's create time;
        None when unknown) has exited."""
        return (pid, started) in self.ended_among([(pid, started)])

    def ended_among(self, keys: list[tuple[int, float | None]]) -> set[tuple[int, float | None]]:
        """Those of the ``(pid, started)`` processes that have exited, in one look."""
        ended, watched = set(), {}
        # Past the limit an open would have to close a pidfd of this same look: /proc.
        keep = set(keys[: self.limit])
        with self._lock:
            for key in keys:
                fd = self._open(key, keep) if key in keep else -1
                if fd is None:
                    ended.add(key)
                elif fd >= 0:
                    watched[fd] = key
                elif not pid_alive(key[0]):  # no pidfd: /proc
                    ended.add(key)
            if watched:
                poller = select.poll()
                for fd in watched:
                    poller.register(fd, select.POLLIN)
                done = select.POLLIN | select.POLLHUP
                ended.update(watched[fd] for fd, ev in poller.poll(0) if ev & done)
        return ended

    def _open(self, key: tuple[int, float | None], keep: set) -> int | None:
        """The pidfd of ``key`` (opened now if need be, closing the oldest not in ``keep``
        beyond the limit); None when that process is gone, -1 when no pidfd can be had."""
        fd = self._fds.get(key)
        if fd is not None:
            return fd
        if not self._usable:
            return -1
        pid, started = key
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None
        except OSError:
            # No pidfd here: every later look reads /proc instead.
            self._usable = False
            return -1
        if started is not None:
            now = _started(pid)
            # Read after the open: a pid taken by another process since means ours has
            # ended, whatever the pidfd names.
            if now == _GONE or (now is not None and abs(now - started) > START_SLACK_S):
                os.close(fd)
                return None
        stale = [k for k in self._fds if k not in keep]
        while len(self._fds) >= self.limit and stale:
            os.close(self._fds.pop(stale.pop(0)))
        self._fds[key] = fd
        return fd

    def close(self) -> None:
        """Close every pidfd held (a later look opens its own again)."""
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def held(self) -> int:
        """How many pidfds are open."""
        return len(self._fds)


__all__ = ["ExitWatch"]
