"""Keeping a local or ssh cluster's hosts for ``%jaxsys attach``: a launcher mixin.

A launcher whose hosts are simply there (this machine, or the hosts it names) mixes this
in before :class:`~.base.Launcher`. Its allocation is then a
:class:`~jaxsys_kernel.cluster.allocation_hosts.KeptHosts`, which ``stop
--keep-allocation`` keeps under a lease, and which a cluster started by ``%jaxsys attach``
holds while it runs: a plain stop (or the kernel's shutdown) gives it back, a kernel's
death leaves it to lapse a TTL later.
"""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError
from ..allocation_hosts import KeptHosts, attach_refusal
from .base import host_part


class KeepsHosts:
    """``keep_allocation`` and attach for a launcher whose hosts need no scheduler."""

    allocation_kind = KeptHosts
    # Set by keep_allocation: the teardown then leaves the lease to lapse.
    _hosts_kept = False

    def make_allocation(self) -> KeptHosts:
        names = [host_part(h) for h in self.config.host_names or ()]
        label = "the named hosts" if names else None
        return KeptHosts(names or None, label=label, launcher=self.name)

    @classmethod
    def job_allocation(cls, job_id: str, ntasks: int = 1, options=None) -> KeptHosts:
        raise ConfigError(
            f"the {cls.name} launcher keeps its hosts under a name, not in a job: "
            "%jaxsys stop --keep-allocation [--name NAME] keeps them, and "
            "%jaxsys attach [--name NAME] starts a cluster on them again"
        )

    @classmethod
    def attach_refusal(cls, job_id: str) -> str | None:
        return attach_refusal(job_id, cls.name)

    def keep_allocation(self) -> KeptHosts | None:
        """Keep the hosts past the teardown, for the lease's TTL after this kernel; the
        engines still stop."""
        alloc = self.allocation
        if not isinstance(alloc, KeptHosts) or alloc.job_id is None:
            return None
        alloc.keep()
        self._hosts_kept = True
        return alloc

    def hold(self, alloc: KeptHosts) -> None:
        """Run on ``alloc``, which ``%jaxsys attach`` took for this cluster."""
        self.allocation = alloc

    def release(self) -> None:
        super().release()
        alloc = self.allocation
        if isinstance(alloc, KeptHosts) and alloc.job_id and not self._hosts_kept:
            alloc.give_back()

    def job(self) -> dict[str, Any] | None:
        # A key is no scheduler's job: the status line names the hosts instead.
        job = super().job()
        if job is not None:
            job["job_id"] = None
        return job
