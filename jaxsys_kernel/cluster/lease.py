"""Leases: how a kept allocation knows that a kernel still wants it.

A lease is one small file: its first line is the time (seconds since the epoch) after
which it has lapsed, so that a batch script in ``sh`` can read it; its second line says,
as JSON, who holds it (pid, start time, host), how long it lasts, whether jaxsys
submitted the job (and may cancel it) and which watchdog watches it. The holder renews it
every third of its TTL; whoever finds it lapsed (the watchdog, the job's own batch
script) gives the allocation back. Holding is exclusive: a second live kernel is refused,
and told who holds it.

Files are written whole (a temporary file, then a rename) and private (0600 in a 0700
directory). This module imports only the standard library and jaxsys's errors: the
watchdog reads leases.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ClusterError
from .pids import alive, process_start

#: Seconds a lease lasts unless renewed; ``JAXSYS_LEASE_TTL`` sets another.
DEFAULT_TTL_S = 45.0
TTL_VAR = "JAXSYS_LEASE_TTL"
#: A lease is kept while its holder lives ("run": the watchdog ends it as soon as the
#: holder dies), or kept for TTL seconds after its last renewal ("kept": for an attach).
RUN, KEPT = "run", "kept"


def ttl_s() -> float:
    """The TTL leases get: ``$JAXSYS_LEASE_TTL`` seconds (at least 3), else 45."""
    try:
        return max(3.0, float(os.environ[TTL_VAR]))
    except (KeyError, ValueError):
        return DEFAULT_TTL_S


def write_private(path: Path, text: str) -> None:
    """Write ``path`` whole (temporary file, then rename), readable by its owner only, in a
    directory only its owner can enter."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        os.chmod(path.parent, 0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass
class LeaseState:
    """What a lease file says."""

    expires: float
    pid: int
    start: int | None
    host: str
    ttl: float
    mode: str = RUN
    owned: bool = True
    watchdog_pid: int | None = None
    watchdog_start: int | None = None

    def lapsed(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) > self.expires

    def holder_alive(self) -> bool | None:
        """Whether the holder lives: known on its own host only (None elsewhere)."""
        if self.host != socket.gethostname():
            return None
        return alive(self.pid, self.start)

    def live(self) -> bool:
        """Whether another kernel may still be using the allocation."""
        here = self.holder_alive()
        return not self.lapsed() and here is not False

    def describe_holder(self) -> str:
        return f"process {self.pid} on {self.host}"

    def watchdog_alive(self) -> bool:
        return (
            self.watchdog_pid is not None
            and self.host == socket.gethostname()
            and alive(self.watchdog_pid, self.watchdog_start)
        )


class LeaseHeldError(ClusterError):
    """Another live kernel holds the lease."""


def read(path: Path) -> LeaseState | None:
    """The lease at ``path``, or None when there is none (or it cannot be read whole)."""
    try:
        first, second = Path(path).read_text().split("\n", 2)[:2]
        return LeaseState(**json.loads(second))
    except (OSError, ValueError, TypeError):
        return None


def refusal(path: Path, what: str) -> str | None:
    """Why this process may not take the lease at ``path`` (another live process holds
    it), or None when it may."""
    old = read(path)
    me = (os.getpid(), process_start(os.getpid()))
    if old is None or (old.pid, old.start) == me or not old.live():
        return None
    until = time.strftime("%H:%M:%S", time.localtime(old.expires))
    return (
        f"{what} is in use by {old.describe_holder()} (its lease runs until {until}): "
        "stop its cluster there (%jaxsys stop), or wait until that kernel is gone and its "
        "lease lapses"
    )


class Lease:
    """The lease at ``path``, held by this process.

    Parameters
    ----------
    path : path-like
    what : str
        How refusals name the allocation (``"Slurm job 12"``).
    """

    def __init__(self, path: str | os.PathLike, what: str):
        self.path = Path(path)
        self.what = what
        self.state: LeaseState | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, owned: bool, mode: str = RUN, ttl: float | None = None) -> LeaseState:
        """Take the lease, or raise :class:`LeaseHeldError` naming the live holder.

        An earlier holder's mode, ownership and watchdog carry over.
        """
        me, start = os.getpid(), process_start(os.getpid())
        old = read(self.path)
        why = refusal(self.path, self.what)
        if why:
            raise LeaseHeldError(why)
        ttl = ttl_s() if ttl is None else ttl
        self.state = LeaseState(
            expires=time.time() + ttl,
            pid=me,
            start=start,
            host=socket.gethostname(),
            ttl=ttl,
            mode=mode,
            owned=old.owned if old is not None else owned,
        )
        if old is not None and old.watchdog_alive():
            self.state.watchdog_pid, self.state.watchdog_start = (
                old.watchdog_pid,
                old.watchdog_start,
            )
        self._write()
        return self.state

    def _write(self) -> None:
        s = self.state
        write_private(self.path, f"{int(s.expires)}\n{json.dumps(asdict(s))}\n")

    def update(self, **changes) -> None:
        """Change what the lease says (its mode, its watchdog) and renew it."""
        for k, v in changes.items():
            setattr(self.state, k, v)
        self.renew()

    def renew(self) -> bool:
        """Push the expiry one TTL ahead; False when another process took the lease."""
        held = read(self.path)
        if held is None or (held.pid, held.start) != (self.state.pid, self.state.start):
            return False
        self.state.expires = time.time() + self.state.ttl
        self._write()
        return True

    def keep_renewing(self) -> None:
        """Renew every third of the TTL from a thread, until :meth:`release` or until
        another process takes the lease."""
        if self._thread is not None:
            return

        def loop() -> None:
            while not self._stop.wait(self.state.ttl / 3):
                with contextlib.suppress(OSError):
                    if not self.renew():
                        return

        self._thread = threading.Thread(target=loop, name="jaxsys-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and remove the lease (if it is still this process's)."""
        self._stop.set()
        held = read(self.path)
        if held is not None and self.state is not None and held.pid == self.state.pid:
            self.path.unlink(missing_ok=True)
