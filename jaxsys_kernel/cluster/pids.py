"""Whether a local process lives, and which process a pid names: the one definition.

This module imports only the standard library, so the Slurm watchdog (a fresh interpreter
that lives as long as its job) and the lease files use it without loading psutil or zmq.
The one other liveness probe in the package is the forked engine's stand-in
(:mod:`jaxsys_kernel.engine.forked`), which runs by path with ``python -S`` and so cannot
import the package at all. The local launcher asks about its engines through
:mod:`jaxsys_kernel.cluster.exit_watch` (a pidfd per engine), which comes here where it
cannot open one.
"""

from __future__ import annotations

import os


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name, or None (gone, or no /proc)."""
    # Without Python's file objects: a cell looks at every process's line before it
    # starts, and open() with its buffering and decoding took 10 us a look against 3 us.
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        line = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        # The command name, in parentheses, may hold spaces and parentheses itself.
        return line.rsplit(b")", 1)[1].decode("ascii", "replace").split()
    except IndexError:
        return None


def pid_alive(pid: int | None) -> bool:
    """Whether a local process exists and is not a zombie."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat_fields(pid)
    if fields is None:
        # Reaped between the two looks, or a system without /proc: the signal said it is there.
        return not os.path.isdir("/proc/self")
    return fields[0] != "Z"


def process_start(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot), or None when there is none."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def alive(pid: int, start: int | None) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` (and no zombie)."""
    if not pid_alive(pid):
        return False
    return start is None or process_start(pid) == start
