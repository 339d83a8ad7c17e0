"""Running a job's command as the owner of all it starts.

The command (a runner of :mod:`~jaxsys_kernel.job.local` or :mod:`~jaxsys_kernel.job.ssh`,
``mpiexec``, ``sbatch --wait``) runs in a session of its own. When the job's time is up, or
``jaxsys job`` gets SIGINT (Ctrl-C) or SIGTERM, that session gets SIGTERM: the runners then
kill every process of the job (local process groups, processes on ssh hosts), and whatever
is left of the session after :data:`END_WAIT_S` gets SIGKILL. A scheduler's job, which
outlives the command that submitted it, is then cancelled with the command given for it
(``scancel``).

Nothing here relies on SIGTERM's default action to end the job's processes: by default they
take SIGTERM as JAX's preemption notice (see :mod:`~jaxsys_kernel.job.preempt`). The runners
end them with SIGKILL, ``mpiexec`` and Slurm follow their SIGTERM with SIGKILL (Slurm after
its ``KillWait``), the session gets SIGKILL here, and a notice ends every process after its
grace.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..cluster.slurm_watch import client_env

# Seconds the command has to end the job's processes after SIGTERM, before SIGKILL.
END_WAIT_S = 10.0
# Seconds the command that cancels a scheduler's job may take.
CANCEL_TIMEOUT_S = 20.0
# Seconds between looks at the command, a signal and the clock.
POLL_S = 0.05
_SIGNALS = {signal.SIGINT: ("interrupted (SIGINT)", 130), signal.SIGTERM: ("terminated", 143)}


@dataclass
class Ending:
    """How the command ended: its exit code, and why it was stopped (None if it was not)."""

    code: int
    stopped: str | None = None


def run_owned(
    command: list[str], cwd: Path, timeout: float, cancel: list[str] | None = None
) -> Ending:
    """Run ``command`` in ``cwd`` for at most ``timeout`` seconds (see the module's docstring).

    Parameters
    ----------
    command : list of str
        The job's command.
    cwd : Path
        The job's folder.
    timeout : float
        Seconds the job may take.
    cancel : list of str, optional
        What cancels the job's scheduler job, when the job is stopped.
    """
    caught: list[int] = []
    previous = _catch(caught)
    try:
        # Without the variables of a Slurm job this may run inside (a Lab's): sbatch and
        # srun would read them as options (SLURM_EXPORT_ENV=NONE drops every variable the
        # processes need), and the job's processes would see the outer job's sizes.
        env = client_env()
        proc = subprocess.Popen(command, cwd=cwd, start_new_session=True, env=env)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and not caught and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if proc.returncode is not None and not caught:
            return Ending(proc.returncode)
        why, code = _SIGNALS[caught[0]] if caught else (f"timeout after {timeout:g} s", 124)
        _end(proc)
        if cancel:
            why += _cancel(cancel, cwd)
        return Ending(code, why)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _catch(caught: list[int]) -> dict:
    """Note SIGINT and SIGTERM in ``caught`` instead of raising (from the main thread only:
    elsewhere Python cannot handle signals, and the caller's own handling stands)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum in _SIGNALS:
        previous[signum] = signal.signal(signum, lambda s, _f: caught.append(s))
    return previous


def _end(proc: subprocess.Popen) -> None:
    """SIGTERM to the command's session (its runner ends the job's processes), then SIGKILL
    to what is left of it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(END_WAIT_S)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _cancel(cancel: list[str], cwd: Path) -> str:
    """Run ``cancel``; what to add to the job's ending when it failed."""
    try:
        r = subprocess.run(
            cancel, cwd=cwd, capture_output=True, text=True, timeout=CANCEL_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"; {shlex.join(cancel)} failed ({e}): cancel the job by hand"
    if r.returncode:
        said = (r.stderr or r.stdout).strip()[-300:]
        return f"; {shlex.join(cancel)} failed ({said}): cancel the job by hand"
    return f"; its job cancelled ({shlex.join(cancel)})"
