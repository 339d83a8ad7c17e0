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


def process_start(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot, from /proc), or None when there
    is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int, start: int | None) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` (and no zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    if fields[0] == "Z":
        return False
    return start is None or int(fields[19]) == start


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


def cancel_until_taken(job_id: str, log: Log) -> int:
    """Cancel the job, trying again with backoff while slurmctld does not answer."""
    backoff = Backoff()
    deadline = time.monotonic() + GIVE_UP_S
    while not cancel_job(job_id):
        if time.monotonic() > deadline or slurm_gone():
            log(f"gave up cancelling job {job_id}: scancel {job_id} by hand", True)
            return 1
        wait = backoff.failed()
        log(f"scancel {job_id} got no answer from slurmctld; trying again in {wait:g} s", True)
        time.sleep(wait)
    log(f"job {job_id} cancelled: its owner is gone")
    return 0


def slurm_gone() -> bool:
    """Whether the Slurm this process was started for is gone: its configuration file
    (``SLURM_CONF``) was removed, so no retry can ever reach its slurmctld."""
    conf = os.environ.get("SLURM_CONF")
    return bool(conf) and not os.path.exists(conf)


def watch(job_id: str, pid: int, start: int | None, log: Log) -> int:
    """Cancel ``job_id`` when process ``pid`` (started at ``start``) is gone; return when
    slurmctld says the job has left the queue."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    queue = Backoff()
    while True:
        if slurm_gone():
            log(f"{os.environ['SLURM_CONF']} is gone: job {job_id} is no longer watched", True)
            return 1
        if not alive(pid, start):
            log(f"process {pid} is gone")
            return cancel_until_taken(job_id, log)
        if queue.due():
            queued = job_queued(job_id)
            if queued is False:
                log(f"job {job_id} has left the queue")
                return 0
            if queued is None:
                wait = queue.failed()
                log(f"squeue got no answer about job {job_id}; again in {wait:g} s", True)
            else:
                queue.succeeded(WATCH_QUEUE_S)
        time.sleep(WATCH_PID_S)


def start_watchdog(job_id: str, pid: int, log_file: str | os.PathLike | None = None):
    """A process that cancels ``job_id`` once ``pid`` is gone, and leaves with the job."""
    argv = [sys.executable, "-m", __name__, "--job", job_id, "--pid", str(pid)]
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
    a = parser.parse_args(argv)
    log = Log(a.log)
    log(f"watching job {a.job} for process {a.pid}")
    try:
        rc = watch(a.job, a.pid, a.pid_start, log)
    except BaseException as e:
        if not isinstance(e, SystemExit):
            log(f"the watchdog of job {a.job} failed: {e!r}; scancel {a.job} by hand", True)
        raise
    log.done()
    return rc


if __name__ == "__main__":
    sys.exit(main())
