"""Hosts kept for the next attach: ``%jaxsys stop --keep-allocation`` on a cluster that
needs no scheduler (this machine, or hosts named for it).

Such a cluster's hosts are simply there (this machine, or the hosts it names): no job
holds them, and every process of the cluster dies with its kernel, a kept one too. What
is kept is the grant itself (which hosts, kept under a key such as ``local-1f2e...``) and
the cluster's options, under a lease (:mod:`.lease`): ``%jaxsys attach`` in this kernel or
a later one starts a cluster of the same shape on the same hosts. The kernel that kept
the hosts, or that runs a cluster on them, renews the lease; it lapses a TTL after that
kernel's end, and a lapsed grant is forgotten when it is next looked at. No process
watches it: nothing is running that would have to be ended.

Holding is exclusive while a cluster runs on the hosts (the lease's "run" mode): a second
kernel is refused, and told which process holds them. Kept hosts ("kept" mode) are free
for whichever kernel attaches first.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .allocation import (
    Allocation,
    JobState,
    JobStatus,
    forget_saved,
    load_saved,
    register,
    saved_names,
    state_dir,
)
from .lease import KEPT, RUN, Lease, LeaseHeldError, process_start, read, ttl_s

# The leases this process holds, one per key.
_HELD: dict[str, Lease] = {}
# What a key looks like: the launcher's name and 12 hex digits.
_KEY = re.compile(r"[a-z][a-z0-9_]{0,31}-[0-9a-f]{12}")


def lease_dir() -> Path:
    """Where the leases of kept hosts are: in the state directory."""
    return state_dir() / "hosts"


def lease_file(key: str) -> Path:
    """The lease of the hosts kept under ``key``."""
    return lease_dir() / f"lease-{key}"


# Taken around every look at and write of a lease of kept hosts; reentrant in a thread.
_LOCK = threading.RLock()
_depth = 0


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One process at a time looks at, takes or renews a lease of kept hosts: two kernels
    attaching at once must not both find them free, and a renewal must not write over the
    lease another kernel has just taken."""
    global _depth
    with _LOCK:
        if _depth == 0:
            folder = lease_dir()
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            lock = open(folder / ".lock", "a")  # noqa: SIM115 - held across the yield
            fcntl.flock(lock, fcntl.LOCK_EX)
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
            if _depth == 0:
                lock.close()  # and with it the lock


class _Lease(Lease):
    """A lease whose renewals (from its thread too) hold :func:`_locked`."""

    def renew(self) -> bool:
        with _locked():
            return super().renew()

    def release(self) -> None:
        with _locked():
            super().release()


@register
class KeptHosts(Allocation):
    """The hosts of a cluster that needs no scheduler, as a grant kept for an attach.

    Parameters
    ----------
    hosts : list of str, optional
        The hosts; this machine when omitted.
    label : str, optional
        How messages name them (``"this machine"``, ``"the named hosts"``).
    launcher : str
        The name of the launcher that starts engines on them.
    job_id : str, optional
        The key they are kept under; None until they are kept (or attached to).
    machine : str, optional
        The machine whose kernel kept them (this one when omitted): a local cluster's
        hosts are that machine.
    """

    kind = "kept-hosts"
    #: Kept hosts are found by name (``%jaxsys attach --name``), never by a job id given.
    takes_job_ids = False

    def __init__(
        self,
        hosts: list[str] | None = None,
        label: str | None = None,
        launcher: str = "",
        job_id: str | None = None,
        machine: str | None = None,
    ):
        super().__init__(hosts, label)
        self.launcher = launcher
        self.job_id = job_id
        self.machine = machine or socket.gethostname()
        # This machine's grant (not hosts named): only a kernel on it may attach.
        self.this_machine = not hosts
        # The name it is saved under (None: the unnamed one), once saved.
        self.saved_as: str | None = None

    def describe_job(self) -> str:
        return f"{self.label} (kept as {self.job_id})" if self.job_id else self.label

    def kept_note(self, path: Path, again: str, nprocs: int) -> str:
        return (
            f"jaxsys: the cluster's hosts, {self.describe_job()}, are kept with its options "
            f"(saved in {path}); its processes stop. {again} starts a cluster of "
            f"{nprocs} processes on them again, in this kernel or another, "
            f"until {ttl_s():g} s after this kernel's end"
        )

    def name_key(self) -> str:
        """The key the hosts are kept under, chosen now if they have none."""
        if self.job_id is None:
            self.job_id = f"{self.launcher}-{secrets.token_hex(6)}"
        return self.job_id

    def poll(self) -> JobStatus:
        """Running while the lease is there and has not lapsed; gone otherwise."""
        if self.job_id is None:
            return super().poll()
        state = read(lease_file(self.job_id))
        if state is None:
            return JobStatus(JobState.GONE, "given back")
        if state.lapsed():
            when = time.strftime("%H:%M:%S", time.localtime(state.expires))
            return JobStatus(
                JobState.GONE,
                f"its lease lapsed at {when}: no kernel attached within {state.ttl:g} s "
                "of its kernel's end",
            )
        return JobStatus(JobState.RUNNING, hosts=self.hosts)

    def refusal(self) -> str | None:
        """Why this kernel may not attach now, or None when it may."""
        here = socket.gethostname()
        if self.this_machine and self.machine != here:
            return (
                f"the hosts kept as {self.job_id} are the machine {self.machine}: attach "
                "in a kernel there, or start a cluster here (%jaxsys start)"
            )
        return attach_refusal(self.job_id, self.launcher)

    def keep(self) -> None:
        """Keep the hosts for the next attach: the lease, renewed while this process
        lives, lapses a TTL after its end unless a kernel attaches first."""
        self._hold(KEPT)

    def attach(self) -> None:
        """Hold the hosts for a cluster of this kernel.

        Raises
        ------
        LeaseHeldError
            When another live kernel runs a cluster on them; names it.
        """
        self._hold(RUN)

    def _hold(self, mode: str) -> None:
        key = self.name_key()
        with _locked():
            lease = _HELD.get(key)
            if lease is not None and lease.state is not None:
                with contextlib.suppress(OSError):
                    if lease.renew():
                        lease.update(mode=mode)
                        return
            why = self.refusal()
            if why:
                raise LeaseHeldError(why)
            # Kept hosts are free for whoever attaches: the earlier holder (the kernel
            # that kept them) stops renewing once it finds the lease taken.
            lease_file(key).unlink(missing_ok=True)
            lease = _Lease(lease_file(key), self.describe_job())
            lease.acquire(owned=True, mode=mode)
            lease.keep_renewing()
            _HELD[key] = lease

    def give_back(self) -> None:
        """End the lease, and forget the saved grant if it is still this one."""
        if self.job_id is None:
            return
        lease = _HELD.pop(self.job_id, None)
        if lease is not None:
            lease.release()
        with contextlib.suppress(ConfigError):
            saved = load_saved(self.saved_as)
            if saved is not None and saved[0].job_id == self.job_id:
                forget_saved(self.saved_as)

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            "launcher": self.launcher,
            "machine": self.machine,
            "this_machine": self.this_machine,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KeptHosts:
        key = d.get("job_id")
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise ValueError(f"{key!r} is not the key of kept hosts")
        kept = cls(
            hosts=d.get("hosts"),
            label=d.get("label"),
            launcher=str(d.get("launcher") or ""),
            job_id=key,
            machine=d.get("machine"),
        )
        kept.this_machine = bool(d.get("this_machine"))
        return kept


def attach_refusal(key: str | None, launcher: str) -> str | None:
    """Why this process may not attach to the hosts kept under ``key`` (another live
    kernel runs a cluster of the ``launcher`` on them), or None when it may."""
    if key is None:
        return None
    what = f"the {launcher} cluster's hosts kept as {key}"
    state = read(lease_file(key))
    if state is None or state.lapsed() or state.mode != RUN:
        return None
    if (state.pid, state.start) == (os.getpid(), process_start(os.getpid())):
        return None  # this kernel's own cluster
    if state.holder_alive() is False:
        return None  # the kernel that ran a cluster on them is gone
    until = time.strftime("%H:%M:%S", time.localtime(state.expires))
    return (
        f"{what} are in use by {state.describe_holder()} (its lease runs until {until}): "
        "stop its cluster there (%jaxsys stop), or wait until that kernel is gone"
    )


def forget_lapsed() -> list[str]:
    """Forget kept hosts whose lease lapsed or was given back (their saved files and
    leases); returns their keys."""
    gone: list[str] = []
    for name in saved_names():
        try:
            saved = load_saved(name)
        except ConfigError:
            continue
        alloc = saved[0] if saved else None
        if isinstance(alloc, KeptHosts) and alloc.job_id not in _HELD:
            if alloc.poll().state.terminal:
                forget_saved(name)
                lease_file(alloc.job_id).unlink(missing_ok=True)
                gone.append(alloc.job_id)
    for path in lease_dir().glob("lease-*"):
        state = read(path)
        if state is not None and state.lapsed():
            path.unlink(missing_ok=True)
            gone.append(path.name.removeprefix("lease-"))
    return gone
