"""Slurm's client commands as a watchdog needs them, and the watchdog itself: a process,
in its own session, that cancels a job once the process that submitted it is gone.

A failing ``squeue`` or ``scancel`` (slurmctld restarting, unreachable, or the command
missing) proves nothing about the job: it is retried with a bounded backoff, and only an
answer from slurmctld says the job left the queue. The owner is named by pid *and* start
time, so a pid reused by another process does not hide the owner's death.

This module imports only the standard library: the watchdog starts in a fresh interpreter
and lives as long as the job.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import lease as leases
from .lease import alive, process_start

__all__ = ["alive", "process_start", "start_watchdog", "watch"]

# Seconds any Slurm command may take (slurmctld answers in milliseconds when it is up).
COMMAND_TIMEOUT_S = 20.0
# How often the watchdog looks at its owner, and at the queue.
WATCH_PID_S = 0.25
WATCH_QUEUE_S = 2.0
# A failing Slurm command is tried again after 1, 2, 4, 8, 15, 15... seconds.
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 15.0
# How long the watchdog keeps trying to cancel a job whose owner died while slurmctld
# does not answer; the job's own time limit bounds it too.
GIVE_UP_S = 24 * 3600.0
# Variables Slurm's commands read as options, and the one kept (where the cluster is).
_SLURM_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SCANCEL_", "SCONTROL_")
_KEPT = frozenset({"SLURM_CONF"})
# Step ids that are the job's own, never a step anyone launched.
JOB_OWN_STEPS = ("batch", "extern", "interactive")


def outer_job_vars(environ=None) -> list[str]:
    """The variables of ``environ`` (``os.environ``) that Slurm's commands would read as
    their options: those of the job this process may run in (``SLURM_EXPORT_ENV``,
    ``SLURM_CPUS_PER_TASK``, ``SLURM_MEM_PER_CPU``, ``SLURM_JOB_ID``...) and the user's
    defaults (``SBATCH_*``, ``SRUN_*``, ``SQUEUE_FORMAT``...). Only ``SLURM_CONF``, which
    says where the cluster is, is kept."""
    environ = os.environ if environ is None else environ
    return sorted(k for k in environ if k.startswith(_SLURM_PREFIXES) and k not in _KEPT)


def client_env(environ=None) -> dict[str, str]:
    """``environ`` (``os.environ``) without :func:`outer_job_vars`: every option a Slurm
    command is run with is then the one on its command line."""
    environ = os.environ if environ is None else environ
    drop = set(outer_job_vars(environ))
    return {k: v for k, v in environ.items() if k not in drop}


def run_slurm(argv: list[str]) -> subprocess.CompletedProcess[str] | None:
    """Run a Slurm client command; None when it is missing or did not answer in time."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
            env=client_env(),
        )
    except (subprocess.TimeoutExpired, OSError):
        return None


def job_queued(job_id: str) -> bool | None:
    """Whether slurmctld lists the job: True or False from its answer, None without one."""
    r = run_slurm(["squeue", "-h", "-j", job_id, "-o", "%T"])
    if r is None:
        return None
    if r.returncode == 0:
        return bool(r.stdout.strip())
    # A job slurmctld has purged is an answer too ("Invalid job id specified").
    return False if "invalid job id" in r.stderr.lower() else None


def cancel_job(job_id: str) -> bool:
    """SIGKILL every process of the job, then cancel it; whether slurmctld took it (or no
    longer knows the job).

    JAX processes ignore SIGTERM, which is all a plain ``scancel`` sends before Slurm's
    KillWait runs out; killing them first ends the job in about a second.
    """
    taken = False
    for argv in (["scancel", "--full", "-s", "KILL", job_id], ["scancel", job_id]):
        r = run_slurm(argv)
        if r is not None and (r.returncode == 0 or "invalid job id" in r.stderr.lower()):
            taken = True
        elif not taken and r is not None and "contact slurm controller" in r.stderr.lower():
            # slurmctld is away: the next command would wait as long, and fail the same.
            return False
    return taken


#: The name of every job step jaxsys launches; cleanup touches no step without it.
STEP_NAME = "jaxsys-engines"


def job_steps(job_id: str) -> list[str] | None:
    """The ids (``J.0``, ``J.1``...) of the job's steps that jaxsys launched (those named
    :data:`STEP_NAME`): never the batch script's, nor a step of the job's owner (their own
    ``srun``, the JupyterLab a job runs). None without an answer from slurmctld."""
    r = run_slurm(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"])
    if r is None or r.returncode != 0:
        return None
    steps = []
    for line in r.stdout.splitlines():
        step, _, name = line.strip().partition(" ")
        if name.strip() == STEP_NAME and step.rpartition(".")[2] not in JOB_OWN_STEPS:
            steps.append(step)
    return steps


def kill_steps(job_id: str) -> bool:
    """SIGKILL the processes of the steps jaxsys launched in the job; the job (its batch
    script) and every other step stay. Whether slurmctld answered.

    Each step is named: Slurm takes SIGKILL sent to the job itself as its cancellation.
    """
    steps = job_steps(job_id)
    if steps is None:
        return False
    if steps:
        r = run_slurm(["scancel", "-s", "KILL", *steps])
        return r is not None and r.returncode == 0
    return True


class Backoff:
    """Waits that double from :data:`BACKOFF_FIRST_S` up to :data:`BACKOFF_MAX_S`."""

    def __init__(self):
        self.wait = 0.0
        self.next_at = 0.0

    def due(self) -> bool:
        return time.monotonic() >= self.next_at

    def failed(self) -> float:
        self.wait = min(BACKOFF_MAX_S, self.wait * 2 if self.wait else BACKOFF_FIRST_S)
        self.next_at = time.monotonic() + self.wait
        return self.wait

    def succeeded(self, then: float) -> None:
        self.wait = 0.0
        self.next_at = time.monotonic() + then


class Log:
    """The watchdog's few lines, in a file that outlives it when something failed."""

    def __init__(self, path: str | None):
        self.path = Path(path) if path else None
        self.failed = False

    def __call__(self, text: str, failure: bool = False) -> None:
        self.failed |= failure
        if self.path is None:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        with contextlib.suppress(OSError):
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a") as f:
                f.write(f"{stamp} {text}\n")

    def done(self) -> None:
        """Remove the log when nothing went wrong."""
        if self.path is not None and not self.failed:
            self.path.unlink(missing_ok=True)


def cancel_until_taken(job_id: str, log: Log, owned: bool = True) -> int:
    """Cancel the job (``owned``: jaxsys submitted it), or else kill the steps jaxsys
    launched in it, trying again with backoff while slurmctld does not answer."""
    backoff = Backoff()
    deadline = time.monotonic() + GIVE_UP_S
    while not (cancel_job(job_id) if owned else kill_steps(job_id)):
        if time.monotonic() > deadline or slurm_gone():
            log(f"gave up cancelling job {job_id}: scancel {job_id} by hand", True)
            return 1
        wait = backoff.failed()
        log(f"scancel {job_id} got no answer from slurmctld; trying again in {wait:g} s", True)
        time.sleep(wait)
    log(f"job {job_id} {'cancelled' if owned else 'steps of jaxsys killed'}: its owner is gone")
    return 0


def slurm_gone() -> bool:
    """Whether the Slurm this process was started for is gone: its configuration file
    (``SLURM_CONF``) was removed, so no retry can ever reach its slurmctld."""
    conf = os.environ.get("SLURM_CONF")
    return bool(conf) and not os.path.exists(conf)


def _lapsed(lease_file: Path | None, pid: int, start: int | None, log: Log) -> bool | None:
    """Whether the owner is gone: True when it is, None when its lease was given back (the
    holder gave the job back itself), False while it holds on."""
    if lease_file is None:
        if alive(pid, start):
            return False
        log(f"process {pid} is gone")
        return True
    held = leases.read(lease_file)
    if held is None:
        log(f"the lease {lease_file} was given back")
        return None
    if held.lapsed():
        log(f"the lease of {held.describe_holder()} lapsed")
        return True
    if held.mode == leases.RUN and held.holder_alive() is False:
        log(f"{held.describe_holder()} is gone")
        return True
    return False


def watch(
    job_id: str,
    pid: int,
    start: int | None,
    log: Log,
    lease_file: Path | None = None,
    owned: bool = True,
) -> int:
    """Give ``job_id`` back when its owner is gone: process ``pid`` (started at ``start``)
    or, with ``lease_file``, the lease's holder (at once in "run" mode, when the lease
    lapses in "kept" mode). Return when slurmctld says the job has left the queue."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    queue = Backoff()
    while True:
        if slurm_gone():
            log(f"{os.environ['SLURM_CONF']} is gone: job {job_id} is no longer watched", True)
            return 1
        gone = _lapsed(lease_file, pid, start, log)
        if gone is None:
            return 0
        if gone:
            rc = cancel_until_taken(job_id, log, owned)
            if lease_file is not None:
                lease_file.unlink(missing_ok=True)
            return rc
        if queue.due():
            queued = job_queued(job_id)
            if queued is False:
                log(f"job {job_id} has left the queue")
                if lease_file is not None:
                    lease_file.unlink(missing_ok=True)
                return 0
            if queued is None:
                wait = queue.failed()
                log(f"squeue got no answer about job {job_id}; again in {wait:g} s", True)
            else:
                queue.succeeded(WATCH_QUEUE_S)
        time.sleep(WATCH_PID_S)


def start_watchdog(
    job_id: str,
    pid: int,
    log_file: str | os.PathLike | None = None,
    lease_file: str | os.PathLike | None = None,
    owned: bool = True,
):
    """A process that gives ``job_id`` back once ``pid`` (or the holder of ``lease_file``)
    is gone, and leaves with the job."""
    argv = [sys.executable, "-m", __name__, "--job", job_id, "--pid", str(pid)]
    if lease_file:
        argv += ["--lease", os.fspath(lease_file)] + ([] if owned else ["--not-owned"])
    start = process_start(pid)
    if start is not None:
        argv += ["--pid-start", str(start)]
    if log_file:
        argv += ["--log", os.fspath(log_file)]
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="cancel a Slurm job when a process dies")
    parser.add_argument("--job", required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--pid-start", type=int, default=None)
    parser.add_argument("--log", default=None)
    parser.add_argument("--lease", default=None)
    parser.add_argument("--not-owned", action="store_true")
    a = parser.parse_args(argv)
    log = Log(a.log)
    log(f"watching job {a.job} for process {a.pid}")
    try:
        lease_file = Path(a.lease) if a.lease else None
        rc = watch(a.job, a.pid, a.pid_start, log, lease_file, not a.not_owned)
    except BaseException as e:
        if not isinstance(e, SystemExit):
            log(f"the watchdog of job {a.job} failed: {e!r}; scancel {a.job} by hand", True)
        raise
    log.done()
    return rc


if __name__ == "__main__":
    sys.exit(main())
