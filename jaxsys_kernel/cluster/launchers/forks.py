"""The kernel's side of a local cluster's fork server (:mod:`jaxsys_kernel.engine.forkserver`).

The server is started with the controller, before any engine, so that its imports overlap
the controller's start-up; engines are launched as the stand-in
(:mod:`jaxsys_kernel.engine.forked`), which waits for the server's socket and falls back to a
plain engine when there is none. The server lives as long as the cluster (world restarts
and the standby fork from it too) and is killed at teardown.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ... import contract
from ..profile import remove_dead_owners
from ..teardown import wait_gone

# Unix socket paths are limited to 107 bytes; a longer profile path gets a short directory.
_MAX_SOCKET_PATH = 100
STOP_WAIT_S = 5.0
SERVER_MODULE = "jaxsys_kernel.engine.forkserver"
# Run by path: the stand-in imports only the standard library (not this package).
STAND_IN = importlib.util.find_spec("jaxsys_kernel.engine.forked").origin
# A short directory for the socket, named by its owner's pid so a later start can reap it.
SOCKET_DIR_PREFIX = "jaxsys-fork-"
# What the server logs when a fork failed (see the server's FORK_FAILED).
_FORK_FAILED_LINE = "refused a request: the fork failed"
_TAIL_LINES = 12
log = logging.getLogger(__name__)


def plain_engine_cmd() -> list[str]:
    """The command of a local engine that is not forked (no fork server, or it died): the
    stand-in's ``--plain`` mode, which arms the engine's parent-death signal before Python
    imports anything and then becomes ``python -m ipyparallel.engine``."""
    return [sys.executable, "-S", STAND_IN, "--plain"]


def _socket_base() -> str:
    # The temporary directory, unless it is itself too long for a socket path (a batch
    # system's per-job TMPDIR can be).
    base = tempfile.gettempdir()
    return base if len(base) <= _MAX_SOCKET_PATH - 40 else "/tmp"


def remove_stale_socket_dirs(base: str | os.PathLike | None = None) -> list[Path]:
    """Delete socket directories whose owner (the pid in their name) is gone.

    Parameters
    ----------
    base : path-like, optional
        Where they are made; the system temporary directory (or /tmp, when that is too
        long for a socket path) by default.

    Returns
    -------
    list of pathlib.Path
        The directories removed.
    """
    return remove_dead_owners(base or _socket_base(), SOCKET_DIR_PREFIX)


class ForkServer:
    """A running fork server: its process, its socket, and the stand-in's command line.

    Parameters
    ----------
    profile : Path
        The cluster's profile directory (the socket and the server's log go there).
    env : mapping
        The server's environment: the kernel's plus what JAX reads at import, the same for
        every rank (a rank whose ``JAX_*`` settings differ starts as a plain engine).
    ready_wait : float
        Seconds a stand-in waits for the server's socket before it starts a plain engine.
    """

    def __init__(self, profile: Path, env: Mapping[str, str], ready_wait: float):
        self.socket_path = str(profile / "forkserver.sock")
        self._socket_dir = None
        self._failure: str | None = None
        # Left by kernels killed with SIGKILL (a stop removes its own).
        remove_stale_socket_dirs()
        if len(self.socket_path) > _MAX_SOCKET_PATH:
            self._socket_dir = tempfile.mkdtemp(
                prefix=f"{SOCKET_DIR_PREFIX}{os.getpid()}-", dir=_socket_base()
            )
            self.socket_path = os.path.join(self._socket_dir, "s")
        self.ready_wait = ready_wait
        self.log_path = profile / "forkserver.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", SERVER_MODULE, self.socket_path],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**env, contract.PARENT_PID: str(os.getpid())},
                # Its own group, like every launcher's process: teardown kills groups.
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        """The server's pid."""
        return self.proc.pid

    def engine_cmd(self) -> list[str]:
        """The command a launcher runs in place of ``python -m ipyparallel.engine``."""
        return [
            sys.executable,
            "-S",
            STAND_IN,
            self.socket_path,
            str(self.proc.pid),
            f"{self.ready_wait:g}",
        ]

    def failure(self) -> str | None:
        """Why the server is not running, in words with what to do and the end of its log;
        None while it runs. Once said, it is kept (the log goes with the profile)."""
        if self._failure is None:
            code = self.proc.poll()
            if code is None:
                return None
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited ({code})"
            tail = self._log_tail()
            self._failure = (
                f"the fork server (pid {self.proc.pid}) {how}; the engines forked from it "
                "ended with it: %jaxsys restart starts them again as plain engines"
                + (f". The end of its log:\n{tail}" if tail else "")
            )
        return self._failure

    def _log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-_TAIL_LINES:])[-2000:]

    def failed_forks(self) -> int:
        """How many engines started plain because the server's ``fork()`` failed."""
        try:
            with open(self.log_path, errors="replace") as f:
                return sum(_FORK_FAILED_LINE in line for line in f)
        except OSError:
            return 0

    def status_line(self) -> str:
        """One line for ``%jaxsys status``: the server's state, failed forks, or its death."""
        why = self.failure()
        if why:
            return "fork server: " + why.split("\n", 1)[0]
        failed = self.failed_forks()
        return f"fork server: pid {self.proc.pid}, serving" + (
            f"; {failed} engine(s) started plain after a failed fork (see {self.log_path})"
            if failed
            else ""
        )

    def stop(self) -> None:
        """Kill the server (its forked engines are killed by teardown first) and wait,
        bounded, until it is gone."""
        why = self.failure()
        if why:
            # Said once more before the log goes with the profile.
            log.warning("%s", why)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            wait_gone([self.proc.pid], STOP_WAIT_S)
        for path in (self.socket_path,):
            try:
                os.unlink(path)
            except OSError:
                pass
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)


def status_line(cluster) -> str | None:
    """The fork server's line for ``%jaxsys status`` (None: the cluster has none)."""
    launcher = getattr(getattr(cluster, "world", None), "launcher", None)
    server = getattr(launcher, "forks", None)
    return server.status_line() if server is not None else None
