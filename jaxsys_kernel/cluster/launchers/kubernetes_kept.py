"""A Kubernetes world as an allocation: what ``%jaxsys stop --keep-allocation`` keeps and
``%jaxsys attach`` finds again.

A world is named by its job id, ``namespace/name``; what it is now is asked of the API,
by the world's labels: its Secret (:data:`~.kubernetes_world.KEPT_LABEL` once kept) and
its pods (``jaxsys.dev/world=<name>``). The lease is the pods' own: they wait the lease's
TTL for a kernel once their engines end (see :mod:`jaxsys_kernel.engine.pod`), so nothing
here renews anything, and a world that lapsed is simply no longer there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ..allocation import (
    Allocation,
    JobState,
    JobStatus,
    forget_saved,
    load_saved,
    register,
    saved_names,
)
from ..lease import ttl_s
from ..records import ClusterStartError
from . import kubernetes_api as api
from .kubernetes_manifests import secret_name, split_job_id
from .kubernetes_world import KEPT_LABEL

_ENDED = ("Succeeded", "Failed")


@register
class KeptWorld(Allocation):
    """The pods of one Kubernetes world, found through the API.

    Parameters
    ----------
    job_id : str
        ``namespace/name`` of the world.
    kubeconfig : str, optional
        The kubeconfig naming the cluster (default: ``$KUBECONFIG``, ``~/.kube/config``
        or the kernel's own pod's).
    top_kind : str
        ``Job`` or ``JobSet``: what ``kubectl delete`` gives it back with.
    """

    kind = "kubernetes-world"
    can_end = True

    def __init__(self, job_id: str, kubeconfig: str | None = None, top_kind: str = "Job"):
        self.namespace, self.world = split_job_id(job_id)
        super().__init__([self.world], label=f"Kubernetes world {self.world}")
        self.job_id = f"{self.namespace}/{self.world}"
        self.kubeconfig = kubeconfig
        self.top_kind = top_kind
        self._api = None

    def describe_job(self) -> str:
        return f"Kubernetes world {self.world} in namespace {self.namespace}"

    def poll(self) -> JobStatus:
        """Running while the world's Secret and its running pods are there (its reason
        says ``kept`` while no kernel runs on it); gone once it was deleted or its pods
        ended.

        Raises
        ------
        ClusterStartError
            When the API does not answer.
        """
        # Deferred: the kubernetes extra, needed only where worlds run on Kubernetes.
        from kubernetes.client.rest import ApiException

        try:
            if self._api is None:
                self._api = api.api_client(self.kubeconfig)
            secret = api.read_secret(self._api, self.namespace, secret_name(self.world))
            pods = api.pods(self._api, self.namespace, self.world)
        except (ApiException, OSError) as e:
            raise ClusterStartError(
                f"the Kubernetes API did not answer about {self.describe_job()}: "
                f"{api.failure(e)}; check the kubeconfig (--kubeconfig)"
            ) from None
        if secret is None or not pods:
            return JobStatus(
                JobState.GONE,
                "deleted, or its pods ended when no kernel attached within their wait",
            )
        ended = [p for p in pods if p.status.phase in _ENDED]
        if ended:
            return JobStatus(JobState.GONE, f"pod {ended[0].metadata.name} ended")
        self._hosts = sorted(p.metadata.name for p in pods)
        if any(p.status.phase != "Running" for p in pods):
            return JobStatus(JobState.PENDING, hosts=self.hosts)
        kept = (secret["metadata"].get("labels") or {}).get(KEPT_LABEL) == "true"
        return JobStatus(JobState.RUNNING, "kept" if kept else "", hosts=self.hosts)

    def kept_note(self, path: Path, again: str, nprocs: int) -> str:
        what = "jobset" if self.top_kind == "JobSet" else "job"
        return (
            f"jaxsys: {self.describe_job()} is kept (saved in {path}): its engines stop, "
            f"and its {nprocs} pods wait {ttl_s():g} s for {again}, in this kernel or "
            f"another; kubectl delete {what} {self.world} -n {self.namespace} gives it back"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "kubeconfig": self.kubeconfig, "top_kind": self.top_kind}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KeptWorld:
        return cls(str(d.get("job_id")), d.get("kubeconfig"), str(d.get("top_kind") or "Job"))


def job_allocation(job_id: str, options: Mapping[str, Any] | None = None) -> KeptWorld:
    """The world ``job_id`` names, on the cluster of the ``options``' kubeconfig."""
    options = options or {}
    kind = "JobSet" if options.get("kind") == "jobset" else "Job"
    return KeptWorld(job_id, options.get("kubeconfig"), kind)


def forget_saved_world(job_id: str) -> None:
    """Forget every kept allocation saved for the world ``job_id`` (it was deleted)."""
    for name in saved_names():
        with contextlib.suppress(ConfigError):
            saved = load_saved(name)
            if saved is not None and isinstance(saved[0], KeptWorld):
                if saved[0].job_id == job_id:
                    forget_saved(name)
