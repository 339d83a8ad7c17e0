"""Run a generated program as N processes on this machine, as a job launcher would.

``python -m jaxsys_kernel.job.local PROGRAM N OUT_DIR``: process ``i`` writes its output to
``OUT_DIR/p{i}.out``. When one process fails, the others get a moment to print their own
errors and are then killed, so that none waits forever in a collective for it. Each process
runs in a process group of its own, and the whole group is killed: what its cells started
goes with it. SIGTERM or SIGINT to this runner, or its parent's death, kills them all too.
How each process ended is written to ``OUT_DIR/exit-codes.json``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..engine.ports import hold_port
from .program import EXIT_CODES

# Seconds the other processes keep running after one failed.
GRACE_S = 3.0
# Linux's prctl option that sends a signal to a process when its parent dies.
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # In the child before it runs the program: if this runner is killed outright, its
    # processes go too (Linux; elsewhere the runner's own handlers are all there is).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def run(program: str, n: int, out_dir: Path) -> int:
    """Run the processes; the exit code is the first failing process's, or 0."""
    # Held while they run: a port merely found free could be taken before process 0 binds it.
    with hold_port("127.0.0.1") as held:
        return _run(program, n, out_dir, f"127.0.0.1:{held.getsockname()[1]}")


def _run(program: str, n: int, out_dir: Path, coordinator: str) -> int:
    procs = []
    stopping = Stopping()
    for rank in range(n):
        env = {
            **os.environ,
            "JAXSYS_PROCESS_ID": str(rank),
            "JAXSYS_NUM_PROCESSES": str(n),
            "JAXSYS_COORDINATOR": coordinator,
            "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
            "PYTHONUNBUFFERED": "1",
        }
        with open(out_dir / f"p{rank}.out", "wb") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, program], env=env, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True, preexec_fn=_die_with_parent,
                )
            )  # fmt: skip
    code, first = supervise(procs, _kill_groups, stopping)
    write_exit_codes(out_dir, procs, first)
    return code


def write_exit_codes(out_dir: Path, procs: list[subprocess.Popen], first: int | None) -> None:
    """How each process ended, and which failed first, for ``jaxsys job``'s last line."""
    codes = {"codes": [p.returncode for p in procs], "first": first}
    (out_dir / EXIT_CODES).write_text(json.dumps(codes))


def _kill_groups(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        # Also when the process itself has ended: what its cells started may not have.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)


class Stopping:
    """Whether this runner was asked to stop (SIGTERM, SIGINT) or lost its parent."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._parent = os.getppid()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._note)

    def _note(self, signum, _frame) -> None:
        self.signal = signum

    def __bool__(self) -> bool:
        return self.signal is not None or os.getppid() != self._parent


def supervise(
    procs: list[subprocess.Popen], kill, stopping: Stopping | None = None
) -> tuple[int, int | None]:
    """Wait for the processes; once one has failed, give the others :data:`GRACE_S`, then
    ``kill(procs)``; when ``stopping`` turns true, kill them at once.

    Returns
    -------
    tuple
        The exit code (the first failing process's, or 0; 128 and the signal's number when
        stopped), and the index of the first process that failed (None if none did).
    """
    failed_at = first = None
    code = 0
    # Every process is polled each round (any() would stop at the first one running, and
    # never see a later one fail while the first waits for it in a collective).
    while [p.poll() for p in procs].count(None):
        bad = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
        if bad and failed_at is None:
            failed_at, first = time.monotonic(), bad[0]
            code = procs[first].returncode
        if stopping or (failed_at is not None and time.monotonic() - failed_at > GRACE_S):
            break
        time.sleep(0.05)
    # Every time, also after all have ended: a cell may have started a process of its own.
    kill(procs)
    for p in procs:
        p.wait()
    if first is None:
        first = next((i for i, p in enumerate(procs) if p.returncode), None)
    if stopping:
        return 128 + (stopping.signal or signal.SIGTERM), first
    code = code or next((p.returncode for p in procs if p.returncode), 0)
    # A process killed by a signal: as a shell reports it (an exit status is 0-255).
    return (128 - code if code < 0 else code), first


if __name__ == "__main__":
    sys.exit(run(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])))
