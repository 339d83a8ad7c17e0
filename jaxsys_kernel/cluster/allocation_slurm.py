"""A Slurm job as an allocation: ``sbatch`` a job that holds the hosts, poll it with
``squeue`` (then ``scontrol``, once it has left the queue), cancel it with ``scancel``.

The job's batch script only holds the allocation; engines run in it as job steps
(``srun --jobid``), so a world restart or an attach reuses the job instead of queueing
again. A watchdog process (:mod:`.slurm_watch`) cancels the job when the process that
submitted it dies without cancelling it (a kernel killed with SIGKILL), and goes when
slurmctld says the job left the queue.

Works with Slurm 22.05 and later, without accounting (``sacct``) or ``--json``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .allocation import Allocation, JobState, JobStatus, register, state_dir
from .lease import KEPT, RUN, Lease, LeaseHeldError, process_start, ttl_s
from .records import ClusterStartError
from .slurm_watch import (
    COMMAND_TIMEOUT_S,
    STEP_NAME,
    cancel_job,
    client_env,
    kill_steps,
    outer_job_vars,
    start_watchdog,
)

__all__ = [
    "STEP_NAME",
    "SlurmAllocation",
    "SlurmError",
    "batch_script",
    "cancel_job",
    "kill_steps",
    "lease_file",
]
# The leases this process holds, one per job.
_HELD: dict[str, Lease] = {}

TOOLS = ("sbatch", "squeue", "scancel", "scontrol", "srun")


class SlurmError(ClusterStartError):
    """A Slurm command failed or is missing."""


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        raise SlurmError(
            f"{argv[0]} is not on PATH: a Slurm allocation needs Slurm's client commands "
            f"({', '.join(TOOLS)}) on this machine, and SLURM_CONF if slurm.conf is not in "
            "its default place"
        )
    r = subprocess.run(
        argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, env=client_env()
    )
    if check and r.returncode != 0:
        raise SlurmError(f"{shlex.join(argv)} failed: {(r.stderr or r.stdout).strip()}")
    return r


def expand_hostlist(nodelist: str) -> list[str]:
    """``host[0-2],x`` -> ``["host0", "host1", "host2", "x"]`` (through ``scontrol``)."""
    if not nodelist or nodelist in ("(null)", "None assigned"):
        return []
    r = _run(["scontrol", "show", "hostnames", nodelist])
    return r.stdout.split()


def batch_script(
    name: str,
    ntasks: int,
    options: dict[str, Any],
    log_file: Path,
    lease_dir: Path | None = None,
) -> str:
    """The batch script of a job that holds ``ntasks`` tasks until it is cancelled, or,
    with ``lease_dir``, until its lease there lapses or is given back."""
    lines = [
        "#!/bin/sh",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --ntasks={ntasks}",
        f"#SBATCH --output={log_file}",
    ]
    for key in ("partition", "time", "account", "qos"):
        if options.get(key):
            lines.append(f"#SBATCH --{key}={options[key]}")
    lines += [f"#SBATCH {arg}" for arg in options.get("sbatch_args") or ()]
    lines += [
        "# Holds the allocation: engines run in it as job steps (srun --jobid).",
        "trap 'exit 0' TERM INT",
    ]
    if lease_dir is None:
        return "\n".join([*lines, "while :; do sleep 3600 & wait $!; done"]) + "\n"
    # The job ends itself when its kernel is gone, also where no watchdog survives it (a
    # Lab's job that ended): when the lease's first line (its expiry) has passed, or the
    # lease, once seen, was given back. Unseen (no shared file system), the watchdog and
    # the time limit end it.
    check = max(1, min(10, int(ttl_s() / 3)))
    lines += [
        f"lease={shlex.quote(str(lease_dir))}/lease-$SLURM_JOB_ID",
        "seen=0",
        "while :; do",
        '  if [ -r "$lease" ]; then',
        '    seen=1; read expires < "$lease" || expires=0',
        '    [ "$(date +%s)" -gt "${expires:-0}" ] 2>/dev/null && exit 0',
        '  elif [ "$seen" = 1 ]; then',
        "    exit 0",
        "  fi",
        f"  sleep {check} & wait $!",
        "done",
    ]
    return "\n".join(lines) + "\n"


def lease_dir() -> Path:
    """Where the leases of Slurm jobs (and their watchdogs' logs) are: in the state
    directory, which a job's nodes see where home directories are shared."""
    return state_dir() / "slurm"


def lease_file(job_id: str) -> Path:
    """The lease of ``job_id``."""
    return lease_dir() / f"lease-{job_id}"


def watchdog_log(job_id: str) -> Path:
    """Where the watchdog of ``job_id`` writes what it did (kept only when something
    failed): in the state directory, which outlives the cluster's profile."""
    folder = lease_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder / f"watchdog-{job_id}.log"


def _scontrol_fields(text: str) -> dict[str, str]:
    return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", text))


@register
class SlurmAllocation(Allocation):
    """One Slurm job holding ``ntasks`` tasks for a cluster.

    Parameters
    ----------
    name : str
        The job's name (the cluster's).
    ntasks : int
        One task per process.
    script_dir : path-like
        Where the batch script and the job's output go (the cluster's profile directory).
    options : dict, optional
        ``partition``, ``time``, ``account``, ``qos`` and ``sbatch_args`` (a list of
        ``--flag=value`` strings).
    job_id : str, optional
        A job that runs already (attach); nothing is submitted then.
    """

    # The kind of allocation (what a saved one is found again by), not a launcher's name:
    # the launcher that uses it is found in the launcher registry.
    kind = "slurm-job"
    can_end = True

    def __init__(
        self,
        name: str = "jaxsys",
        ntasks: int = 1,
        script_dir: str | os.PathLike | None = None,
        options: dict[str, Any] | None = None,
        job_id: str | None = None,
    ):
        super().__init__(hosts=None)
        self._hosts = []
        self.name = name
        self.ntasks = ntasks
        self.script_dir = Path(script_dir) if script_dir else None
        self.options = dict(options or {})
        self.job_id = job_id
        self.watchdog: subprocess.Popen | None = None
        self.lease: Lease | None = None
        self.last = JobStatus(JobState.SUBMITTING)

    def describe_job(self) -> str:
        return f"Slurm job {self.job_id}" if self.job_id else "the Slurm job"

    def kept_note(self, path: Path, again: str, nprocs: int) -> str:
        return f"{super().kept_note(path, again, nprocs)}; scancel {self.job_id} gives it back"

    def submit(self) -> None:
        """``sbatch`` the job (its script in ``script_dir``), take its lease and start its
        watchdog; for a job given by its id, take its lease (refused while another live
        kernel holds it)."""
        if self.job_id is not None:
            self.take_lease(owned=False, mode=KEPT)
            return
        if self.script_dir is None:
            raise SlurmError("a Slurm allocation needs a directory for its batch script")
        self.script_dir.mkdir(parents=True, exist_ok=True)
        script = self.script_dir / "jaxsys-allocation.sbatch"
        log_file = self.script_dir / "log" / "slurm-%j.out"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(
            batch_script(self.name, self.ntasks, self.options, log_file, lease_dir())
        )
        # Everything the job gets is said here: an --export of the job this kernel runs in
        # (SLURM_EXPORT_ENV) or its sizes (SLURM_CPUS_PER_TASK...) are not inherited.
        r = _run(["sbatch", "--export=ALL", "--parsable", str(script)])
        self.job_id = r.stdout.strip().split(";")[0]
        self.last = JobStatus(JobState.PENDING)
        try:
            self.take_lease(owned=True, mode=RUN)
        except BaseException:
            cancel_job(self.job_id)
            raise

    def take_lease(self, owned: bool, mode: str) -> None:
        """Hold the job's lease (renewed from a thread) and see that a watchdog watches it.

        Raises
        ------
        SlurmError
            When another live kernel holds the lease; names it.
        """
        lease = _HELD.get(self.job_id) or Lease(lease_file(self.job_id), self.describe_job())
        try:
            state = lease.acquire(owned=owned, mode=mode)
        except LeaseHeldError as e:
            raise SlurmError(str(e)) from None
        _HELD[self.job_id] = lease
        self.lease = lease
        if state.watchdog_pid is None:
            self.watchdog = start_watchdog(
                self.job_id,
                os.getpid(),
                watchdog_log(self.job_id),
                lease_file=lease.path,
                owned=state.owned,
            )
            lease.update(
                watchdog_pid=self.watchdog.pid, watchdog_start=process_start(self.watchdog.pid)
            )
        lease.keep_renewing()

    def poll(self) -> JobStatus:
        """The job's state, reason and nodes: from ``squeue`` while it is queued, then
        from ``scontrol`` while slurmctld remembers it."""
        if self.job_id is None:
            return self.last
        r = _run(["squeue", "-h", "-j", self.job_id, "-o", "%T|%r|%N"], check=False)
        line = r.stdout.strip()
        if r.returncode == 0 and line:
            state, reason, nodes = (line.split("|") + ["", ""])[:3]
            status = JobStatus(JobState.from_slurm(state), reason, expand_hostlist(nodes))
        else:
            status = self._ended()
        if status.hosts:
            self._hosts = status.hosts
        self.last = status
        return status

    def _ended(self) -> JobStatus:
        r = _run(["scontrol", "-o", "show", "job", self.job_id], check=False)
        fields = _scontrol_fields(r.stdout) if r.returncode == 0 else {}
        if "JobState" not in fields:
            return JobStatus(JobState.GONE, "slurmctld no longer knows the job")
        return JobStatus(JobState.from_slurm(fields["JobState"]), fields.get("Reason", ""))

    def output_tail(self, lines: int = 15) -> str:
        """The last lines the job's batch script printed ("" when there are none)."""
        if self.script_dir is None or self.job_id is None:
            return ""
        try:
            text = (self.script_dir / "log" / f"slurm-{self.job_id}.out").read_text()
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def cancel(self) -> None:
        """Kill every process of the job at once, then end the job and give its lease
        back (its watchdog, with nothing left to watch, goes)."""
        if self.job_id is None:
            return
        cancel_job(self.job_id)
        lease = _HELD.pop(self.job_id, None) or self.lease
        if lease is not None:
            lease.release()
        if self.watchdog is not None:
            with contextlib.suppress(OSError):
                self.watchdog.kill()
            self.watchdog.wait(5)
            self.watchdog = None

    def keep(self) -> None:
        """Let the job outlive this process: its lease, still renewed while this process
        lives, no longer ends with it but lapses a TTL after its last renewal, unless a
        later kernel attaches (and takes it) first."""
        if self.lease is not None:
            self.lease.update(mode=KEPT)

    def step_command(self, ntasks: int) -> list[str]:
        """The ``srun`` prefix that runs one task per process inside the job.

        The engines get this process's environment (``--export=ALL``) with the variables
        of the job it may itself run in left out (``env -u``): a JupyterLab submitted with
        ``--export=NONE`` or an export list sets ``SLURM_EXPORT_ENV``, which would keep
        jaxsys's variables from the engines, and its sizes would be the step's.
        """
        unset = [a for name in outer_job_vars() for a in ("-u", name)]
        return [
            *(["env", *unset] if unset else []),
            "srun",
            f"--jobid={self.job_id}",
            f"--ntasks={ntasks}",
            f"--job-name={STEP_NAME}",
            "--export=ALL",
            "--overlap",
            "--kill-on-bad-exit=0",
            *self.options.get("srun_args", ()),
        ]

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "name": self.name, "ntasks": self.ntasks}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SlurmAllocation:
        return cls(name=d.get("name", "jaxsys"), ntasks=d.get("ntasks", 1), job_id=d["job_id"])
