"""The kernel's side of a local cluster's fork server (:mod:`jaxsys_kernel.engine.forkserver`).

The server is started with the controller, before any engine, so that its imports overlap
the controller's start-up; engines are launched as the stand-in
(:mod:`jaxsys_kernel.engine.forked`), which waits for the server's socket and falls back to a
plain engine when there is none. The server lives as long as the cluster (world restarts
and the standby fork from it too) and is killed at teardown.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ... import contract
from ..teardown import wait_gone

# Unix socket paths are limited to 107 bytes; a longer profile path gets a short directory.
_MAX_SOCKET_PATH = 100
STOP_WAIT_S = 5.0
SERVER_MODULE = "jaxsys_kernel.engine.forkserver"
# Run by path: the stand-in imports only the standard library (not this package).
STAND_IN = importlib.util.find_spec("jaxsys_kernel.engine.forked").origin


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
        if len(self.socket_path) > _MAX_SOCKET_PATH:
            self._socket_dir = tempfile.mkdtemp(prefix="jaxsys-fork-")
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
        """Why the server is not running (its exit and the end of its log), or None."""
        code = self.proc.poll()
        if code is None:
            return None
        try:
            tail = self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            tail = ""
        return f"the fork server exited with {code}" + (f":\n{tail}" if tail else "")

    def stop(self) -> None:
        """Kill the server (its forked engines are killed by teardown first) and wait,
        bounded, until it is gone."""
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
            try:
                os.rmdir(self._socket_dir)
            except OSError:
                pass
