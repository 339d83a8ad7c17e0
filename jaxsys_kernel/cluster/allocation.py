"""Allocations: the hosts a cluster was given, apart from the engines started on them.

An :class:`Allocation` holds one grant of hosts: for a scheduler, a job (submitted,
pending, running, then ended with a reason); otherwise, hosts that are simply there. A
launcher starts engines on an allocation; the allocation alone knows how the grant is
asked for, watched and given back. Allocations are saved with
:meth:`Allocation.to_dict` and found again with :func:`allocation_from_dict`, so a
cluster can be attached to after its kernel restarted.
"""

from __future__ import annotations

import enum
import json
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .. import contract
from ..errors import ConfigError
from .lease import ttl_s, write_private
from .records import ClusterStartError

# Seconds between polls of a scheduler while a job waits to run.
POLL_S = 0.5


class JobState(enum.Enum):
    """Where an allocation stands. The terminal states are those of Slurm's job states."""

    SUBMITTING = "submitting"
    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETING = "completing"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"
    TIMEOUT = "timeout"
    PREEMPTED = "preempted"
    NODE_FAIL = "node_fail"
    OUT_OF_MEMORY = "out_of_memory"
    BOOT_FAIL = "boot_fail"
    DEADLINE = "deadline"
    #: The scheduler no longer knows the job, and nothing says how it ended.
    GONE = "gone"

    @property
    def terminal(self) -> bool:
        """Whether the allocation is over (its hosts are no longer ours)."""
        return self not in _LIVE

    @classmethod
    def from_slurm(cls, text: str) -> JobState:
        """A Slurm state (``PENDING``, ``CANCELLED by 0``, ``CG``...) as a JobState."""
        word = text.strip().split(" ")[0].upper().rstrip("+")
        word = _SLURM_SHORT.get(word, word)
        try:
            return cls[word]
        except KeyError:
            # REQUEUED, RESIZING, SIGNALING, STAGE_OUT, ...: the job is still the scheduler's.
            return cls.PENDING


_LIVE = {JobState.SUBMITTING, JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED}
_SLURM_SHORT = {
    "PD": "PENDING",
    "R": "RUNNING",
    "S": "SUSPENDED",
    "CG": "COMPLETING",
    "CD": "COMPLETED",
    "CA": "CANCELLED",
    "F": "FAILED",
    "TO": "TIMEOUT",
    "PR": "PREEMPTED",
    "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY",
    "BF": "BOOT_FAIL",
    "DL": "DEADLINE",
}


@dataclass
class JobStatus:
    """One look at an allocation.

    Attributes
    ----------
    state : JobState
    reason : str
        The scheduler's reason (why a job waits, or how it ended); "" when it gives none.
    hosts : list of str
        The hosts granted, in order (empty until the job runs).
    """

    state: JobState
    reason: str = ""
    hosts: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """``"pending (Resources)"``, ``"running on host0,host1"``..."""
        text = self.state.value
        if self.reason and self.reason.lower() not in ("none", "(null)"):
            text += f" ({self.reason})"
        if self.hosts and not self.state.terminal:
            text += f" on {','.join(self.hosts)}"
        return text


class AllocationEndedError(ClusterStartError):
    """The scheduler ended the job before its engines could run."""


class Allocation:
    """Hosts granted to one cluster. This base class is the trivial grant: hosts that are
    there already (this machine, or the hosts an ssh cluster names).

    Parameters
    ----------
    hosts : list of str, optional
        The hosts; this machine when omitted.
    label : str, optional
        How messages name the grant (``"this machine"``, ``"the named hosts"``).
    """

    #: The name saved in :meth:`to_dict`, by which :func:`allocation_from_dict` finds the class.
    kind: ClassVar[str] = "hosts"
    #: Whether the grant can end under a running cluster (and must be polled).
    can_end: ClassVar[bool] = False

    def __init__(self, hosts: list[str] | None = None, label: str | None = None):
        self._hosts = list(hosts) if hosts else [socket.gethostname()]
        self.label = label or ("the hosts" if hosts else "this machine")
        self.job_id: str | None = None

    def submit(self) -> None:
        """Ask for the hosts (nothing to ask for here)."""

    def poll(self) -> JobStatus:
        """Where the allocation stands now."""
        return JobStatus(JobState.RUNNING, hosts=list(self._hosts))

    @property
    def hosts(self) -> list[str]:
        """The hosts granted (empty while they are not)."""
        return list(self._hosts)

    def wait_running(
        self,
        report: Callable[[str, int, int], None] | None = None,
        timeout: float | None = None,
        poll_s: float = POLL_S,
    ) -> JobStatus:
        """Wait until the allocation runs, reporting its state and reason while it waits.

        Parameters
        ----------
        report : callable, optional
            Called as ``report(what, 0, 1)`` whenever the state or reason changes.
        timeout : float, optional
            Seconds to wait; without it, wait as long as the scheduler keeps the job.

        Raises
        ------
        AllocationEndedError
            When the job ends (is cancelled, fails...) before it runs; names the reason.
        TimeoutError
            When it does not run within ``timeout``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        while True:
            status = self.poll()
            seen = (status.state, status.reason)
            if report is not None and seen != last:
                report(f"{self.describe_job()} {status.describe()}", 0, 1)
                last = seen
            if status.state is JobState.RUNNING:
                return status
            if status.state.terminal:
                raise AllocationEndedError(
                    f"{self.describe_job()} ended before it ran: {status.describe()}"
                )
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.describe_job()} is still {status.describe()} after {timeout:g} s"
                )
            time.sleep(poll_s)

    def cancel(self) -> None:
        """Give the hosts back (nothing to give back here)."""

    def describe_job(self) -> str:
        """How messages name this allocation."""
        return self.label

    def kept_note(self, path: Path, again: str, nprocs: int) -> str:
        """What ``%jaxsys stop --keep-allocation`` says once this allocation was kept
        (saved in ``path``, attached to again with the command ``again``) for a cluster of
        ``nprocs`` processes."""
        return (
            f"jaxsys: {self.describe_job()} is kept (saved in {path}): {again} starts "
            f"engines in it again, also after a kernel restart within {ttl_s():g} s of this "
            "kernel's end"
        )

    def to_dict(self) -> dict[str, Any]:
        """What :func:`allocation_from_dict` needs to find this allocation again."""
        return {"kind": self.kind, "hosts": self.hosts, "job_id": self.job_id, "label": self.label}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Allocation:
        """The allocation :meth:`to_dict` described."""
        return cls(hosts=d.get("hosts"), label=d.get("label"))


_KINDS: dict[str, type[Allocation]] = {}


def register(cls: type[Allocation]) -> type[Allocation]:
    """Make ``cls`` known to :func:`allocation_from_dict` (a class decorator)."""
    _KINDS[cls.kind] = cls
    return cls


register(Allocation)


def hostfile_hosts(path: str | os.PathLike) -> list[str]:
    """The hosts an Open MPI hostfile names (``node1 slots=2``), each once, in order.

    Raises
    ------
    ConfigError
        When the file cannot be read.
    """
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"cannot read the hostfile {path}: {e.strerror}") from None
    hosts: list[str] = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if words and words[0] not in hosts:
            hosts.append(words[0])
    return hosts


@register
class MpiAllocation(Allocation):
    """The hosts of one ``mpiexec`` job: those its hostfile names, or this machine.

    ``mpiexec`` itself is the launcher's engine process: it starts with the engines and
    the launcher kills it with them, so there is nothing here to submit or cancel.

    Parameters
    ----------
    hostfile : path-like, optional
        The Open MPI hostfile the ranks are spread over.
    """

    kind = "mpiexec"

    def __init__(self, hostfile: str | os.PathLike | None = None, hosts: list[str] | None = None):
        super().__init__(hosts, label="the mpiexec job")
        self.hostfile = os.fspath(hostfile) if hostfile else None
        self._read = hosts is not None

    @property
    def hosts(self) -> list[str]:
        # Read when first asked: the launcher checks the hostfile (and names it when it is
        # missing) before anything starts.
        if not self._read and self.hostfile and Path(self.hostfile).is_file():
            self._hosts = hostfile_hosts(self.hostfile) or self._hosts
            self._read = True
        return list(self._hosts)

    def poll(self) -> JobStatus:
        return JobStatus(JobState.RUNNING, hosts=self.hosts)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "hostfile": self.hostfile}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MpiAllocation:
        return cls(hostfile=None, hosts=d.get("hosts"))


def allocation_from_dict(d: dict[str, Any]) -> Allocation:
    """The allocation a saved :meth:`Allocation.to_dict` describes.

    Raises
    ------
    ValueError
        For a kind no module registered.
    """
    try:
        cls = _KINDS[d["kind"]]
    except KeyError:
        raise ValueError(
            f"no allocation of kind {d.get('kind')!r}; known kinds: {', '.join(_KINDS)}"
        ) from None
    return cls.from_dict(d)


# -- an allocation kept for the next kernel ---------------------------------------------------

#: The file, in the state directory, that keeps the allocation saved without a name.
SAVED_NAME = "kernel-allocation.json"
#: What a kept allocation may be named: a word of letters, digits, ``.``, ``_`` and ``-``.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def state_dir() -> Path:
    """Where jaxsys keeps state between processes: ``$JAXSYS_STATE_DIR``, else
    ``~/.jaxsys/clusters`` (the directory ``jaxsys cluster start`` uses)."""
    given = os.environ.get(contract.STATE_DIR)
    return Path(given) if given else Path.home() / ".jaxsys" / "clusters"


def check_name(name: str | None) -> str | None:
    """``name`` if it can name a kept allocation (None: the unnamed one).

    Raises
    ------
    ConfigError
        For a name with a path separator, ``..`` or anything but letters, digits, ``.``,
        ``_`` and ``-`` (at most 64).
    """
    if name is None or (_NAME.fullmatch(name) and ".." not in name):
        return name
    raise ConfigError(
        f"{name!r} cannot name a kept allocation: use letters, digits, '.', '_' and '-' "
        "(at most 64, no '..' and no '/'), e.g. --name big-run"
    )


def saved_file(name: str | None = None) -> Path:
    """The file :func:`save_allocation` writes for ``name``."""
    name = check_name(name)
    return state_dir() / (SAVED_NAME if name is None else f"kernel-allocation-{name}.json")


def saved_names() -> list[str | None]:
    """The names of the kept allocations (None: the unnamed one)."""
    names: list[str | None] = []
    for path in sorted(state_dir().glob("kernel-allocation*.json")):
        if path.name == SAVED_NAME:
            names.insert(0, None)
        else:
            names.append(path.name[len("kernel-allocation-") : -len(".json")])
    return names


def save_allocation(
    allocation: Allocation, options: Mapping[str, Any], name: str | None = None
) -> Path:
    """Keep ``allocation`` and the options of the cluster it served (``ClusterConfig``'s
    :meth:`to_dict`), for ``%jaxsys attach`` in a later kernel; returns the file.

    The file is written whole (a temporary file, then a rename) and private (0600 in a
    0700 directory): the options hold ``--env`` values.
    """
    path = saved_file(name)
    saved = {"allocation": allocation.to_dict(), "options": dict(options), "saved": time.time()}
    write_private(path, json.dumps(saved, indent=2, sort_keys=True) + "\n")
    return path


def load_saved(name: str | None = None) -> tuple[Allocation, dict[str, Any]] | None:
    """The allocation :func:`save_allocation` kept under ``name`` and its cluster's
    options, or None.

    Raises
    ------
    ConfigError
        Naming the file, when it cannot be read or does not describe an allocation.
    """
    path = saved_file(name)
    try:
        saved = json.loads(path.read_text())
        return allocation_from_dict(saved["allocation"]), dict(saved.get("options") or {})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{path} does not describe a saved allocation ({e}); remove it, and give the "
            "job's id instead"
        ) from None


def forget_saved(name: str | None = None) -> None:
    """Remove the kept allocation ``name`` (it ended, or was given back)."""
    saved_file(name).unlink(missing_ok=True)
