"""Run a generated program as N processes on this machine, as a job launcher would.

``python -m jaxsys_kernel.job.local PROGRAM N OUT_DIR``: process ``i`` writes its output to
``OUT_DIR/p{i}.out``. When one process fails, the others get a moment to print their own
errors and are then killed, so that none waits forever in a collective for it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# Seconds the other processes keep running after one failed.
GRACE_S = 3.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(program: str, n: int, out_dir: Path) -> int:
    """Run the processes; the exit code is the first failing process's, or 0."""
    coordinator = f"127.0.0.1:{_free_port()}"
    procs = []
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
                    start_new_session=True,
                )
            )  # fmt: skip
    return supervise(procs, _kill_groups)


def _kill_groups(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def supervise(procs: list[subprocess.Popen], kill) -> int:
    """Wait for the processes; once one has failed, give the others :data:`GRACE_S`, then
    ``kill(procs)``. The exit code is the first failing process's, or 0."""
    failed_at = None
    code = 0
    # Every process is polled each round (any() would stop at the first one running, and
    # never see a later one fail while the first waits for it in a collective).
    while [p.poll() for p in procs].count(None):
        bad = [p.returncode for p in procs if p.returncode not in (None, 0)]
        if bad and failed_at is None:
            failed_at, code = time.monotonic(), bad[0]
        if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
            kill(procs)
            for p in procs:
                p.wait()
            break
        time.sleep(0.05)
    return code or next((p.returncode for p in procs if p.returncode), 0)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])))
