"""A forked engine's nanny, forked from the engine before it starts, not started afresh.

ipyparallel gives each remote engine a nanny, the process that relays signals to it (an
interrupt, the hang doctor's stack request). It starts one as a new interpreter that
imports ipyparallel again: about 0.3 s of CPU and a quarter of a second before the engine
registers, per engine. An engine forked by the fork server has those modules imported
already, so while it is still single-threaded it forks a stub that waits for the nanny's
arguments; ipyparallel's start of the nanny then hands them to the stub over a pipe, in the
same way it would hand them to a new interpreter (pickled on its standard input; the
nanny's address back on its standard output, whose closing tells the nanny its engine is
gone). When the stub cannot serve, ipyparallel starts its nanny as before.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import BinaryIO

# The engine option that turns the nanny off (the local launcher's engines have none).
_NO_NANNY = "--ipengine.enable_nanny=false"
# Bytes of pickled arguments a stub reads at most (they are a few keys and addresses).
MAX_ARGS_BYTES = 1 << 20


def wanted(argv: Sequence[str]) -> bool:
    """Whether an engine started with ``argv`` starts a nanny."""
    return not any(a.lower() == _NO_NANNY for a in argv)


@dataclass
class Stub:
    """The engine's side of a waiting stub: its pid and the two pipe ends."""

    pid: int
    to_stub: int
    from_stub: int

    def start(self, fallback: Callable, **kwargs):
        """ipyparallel's ``start_nanny``: the nanny's address and a handle whose ``pid``
        is the nanny's. The handle keeps the pipe the nanny watches open."""
        reader = os.fdopen(self.from_stub, "rb")
        try:
            with os.fdopen(self.to_stub, "wb") as w:
                w.write(pickle.dumps({**kwargs, "pid": os.getpid()}))
            url = reader.readline().decode().strip()
        except OSError:
            url = ""
        if not url:
            reader.close()
            return fallback(**kwargs)
        return url, _Handle(self.pid, reader)


@dataclass
class _Handle:
    """What the engine keeps of its nanny (ipyparallel keeps a ``Popen``)."""

    pid: int
    stdout: BinaryIO


def fork() -> Stub | None:
    """Fork a stub that becomes this engine's nanny once given its arguments.

    Called while the engine is single-threaded. The stub keeps its two pipes and standard
    error open and closes every other descriptor. None when the fork fails (ipyparallel
    then starts its nanny itself).
    """
    r_args, w_args = os.pipe()
    r_url, w_url = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        for fd in (r_args, w_args, r_url, w_url):
            os.close(fd)
        return None
    if pid == 0:
        _become_nanny(r_args, w_url, {r_args, w_url, 2})
    os.close(r_args)
    os.close(w_url)
    return Stub(pid, w_args, r_url)


def _become_nanny(r_args: int, w_url: int, keep: set[int]) -> None:
    """In the stub: wait for the arguments, run the nanny, never return."""
    code = 0
    try:
        # Its own session, as ipyparallel starts it: an engine's signals are not its own.
        os.setsid()
        _only(keep)
        devnull = os.open(os.devnull, os.O_RDWR)  # fd 0: the lowest one free
        if devnull != 0:
            os.dup2(devnull, 0)
            os.close(devnull)
        os.dup2(2, 1)
        data = _read_all(r_args)
        if not data:
            return  # the engine ended, or never wanted its nanny
        kwargs = pickle.loads(data)
        kwargs["pipe"] = os.fdopen(w_url, "w", buffering=1)
        # Deferred: imported by the fork server already; named where the nanny runs.
        from ipyparallel.engine.nanny import KernelNanny

        KernelNanny.main(**kwargs)
    except BaseException:  # noqa: BLE001 - a stub must end here, whatever happened
        traceback.print_exc()
        code = 1
    finally:
        sys.stderr.flush()
        os._exit(code)


def _read_all(fd: int) -> bytes:
    chunks, size = [], 0
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_ARGS_BYTES:
            return b""
    os.close(fd)
    return b"".join(chunks)


def _only(keep: set[int]) -> None:
    """Close every descriptor but ``keep``: the engine's sockets and its stand-in's
    streams must not stay open in a process that outlives nothing of theirs."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 256))
    for fd in fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
