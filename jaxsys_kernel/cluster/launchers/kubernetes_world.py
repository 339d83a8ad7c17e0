"""A notebook's cluster on Kubernetes: each world's engines as the pods of one Job.

The kernel keeps its ipyparallel controller; a world is the launcher's manifests
(:func:`~.kubernetes.world_manifests`) with, in its Secret, what an engine needs to join
that controller: the controller's engine connection file (with its CurveZMQ keys), the
engines' ipyparallel config and environment, and every process's certificate and key for
mTLS. Pod *i* is process *i* (its Job's completion index). Nothing of the kernel's
filesystem is needed in the pods.

Pods outlive their engines (:mod:`jaxsys_kernel.engine.pod` runs in each): what they run
is the *generation* the Secret holds. So a world can be kept past its cluster
(``%jaxsys stop --keep-allocation`` writes a generation without an engine, which ends the
engines) and taken by the next kernel (``%jaxsys attach`` writes that kernel's
generation), without making the pods again; the other ways, recreating the pods or
reaching into them (``kubectl exec``), would lose the pods or need more rights and a
channel into the cluster. A world restart (``%jaxsys restart``) also runs in the same
pods: a generation without an engine ends the old engines, the next one starts the new
world's; only a world with a pod gone is made anew. The kernel annotates the pods after each write, so that the
kubelet projects the new Secret at once rather than at its next sync, up to a minute
later. A world whose engines ended (the kernel died, or nobody attached) waits the lease's
TTL (``JAXSYS_LEASE_TTL``) for a kernel, then its pods end and the cluster deletes it.
"""

from __future__ import annotations

import base64
import secrets
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...engine.pod import ENGINE_CONFIG, ENGINE_FILE, GENERATION, RESTART_PREFIX
from ...engine.pod_standby import STANDBY_PREFIX
from ...errors import ClusterError
from ..records import ClusterStartError
from . import kubernetes_api as api
from . import kubernetes_owner as owner_of
from .kubernetes_generation import (  # noqa: F401 - pod_command and the rest are this module's too
    credential_files,
    generation_files,
    in_cluster_address,
    pod_command,
    pod_env,
    wait_file,
)
from .kubernetes_manifests import secret_name, split_job_id, world_manifests, world_name

__all__ = ["ENGINE_CONFIG", "ENGINE_FILE", "KEPT_LABEL", "PodWorlds", "pod_command"]

#: The label of a kept world's Secret: a kernel may attach to it.
KEPT_LABEL = "jaxsys.dev/kept"
#: The pod annotation whose change makes the kubelet project the Secret again.
GENERATION_ANNOTATION = "jaxsys.dev/generation"
# Seconds between looks at the pods while they start, and while the cluster runs.
START_POLL_S = 0.2
RUN_POLL_S = 2.0
# Seconds a world's deletion waits for its pods to be gone.
DELETE_WAIT_S = 15.0
# A finished Job (its pods ended: their kernel died and nobody attached within the lease's
# TTL) is deleted by the cluster this long after, and its Secret and Service with it
# (launcher option ttl_after_finished).
TTL_AFTER_FINISHED_S = 60


def _named(api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any]:
    """What deleting an object needs of its manifest."""
    meta = {"name": name, "namespace": namespace}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}


class PodWorlds:
    """The worlds one cluster made on Kubernetes, and what their pods are doing.

    Parameters
    ----------
    options : dict
        The launcher's options (image, namespace, kind, ...; ``kubeconfig`` names the
        cluster, else ``$KUBECONFIG``, ``~/.kube/config`` or the kernel's own pod's).
    nprocs : int
    """

    def __init__(self, options: Mapping[str, Any], nprocs: int):
        self.options = dict(options)
        self.nprocs = nprocs
        self.namespace = self.options.get("namespace") or "default"
        self.per_job = nprocs // int(self.options.get("replicas", 1))
        self._api = None
        # The manifests of the world that runs (None between worlds).
        self.manifests: list[dict[str, Any]] | None = None
        self.name: str | None = None
        self._pods: dict[int, Any] = {}
        self._last_poll = 0.0
        self.top_kind = "JobSet" if self.options.get("kind") == "jobset" else "Job"
        # The kernel's own pod as the owner of every world, once looked up.
        self._owner: dict[str, Any] | None = None
        self.owner_note: str | None = None
        # Why the pods saw the last generation only late (end_engines), or None.
        self.nudge_note: str | None = None
        # The standby engine kept in each living pod, by rank: its engine set's id and its
        # entry in the Secret (kubernetes_generation.standby_entry); and what they all
        # start with (standby_shared), made once per world.
        self.standby: dict[int, tuple[str, dict[str, bytes]]] = {}
        self.standby_files: dict[str, bytes] = {}

    @property
    def client(self):
        if self._api is None:
            self._api = api.api_client(self.options.get("kubeconfig"))
        return self._api

    def make(self, cluster_id: str, incarnation: int, files: Mapping[str, bytes], args=()) -> None:
        """Create world ``incarnation`` of this cluster, its Secret holding ``files`` (a
        generation, :func:`generation_files`), its engines run with ``args``: the Secret,
        Service and Job."""
        name = world_name(cluster_id, incarnation)
        python = self.options.get("python") or "python3"
        manifests = world_manifests(
            name, self.nprocs, pod_command(python, args), self.options, credentials=files
        )
        ttl = int(self.options.get("ttl_after_finished", TTL_AFTER_FINISHED_S))
        [top] = [m for m in manifests if m["kind"] in ("Job", "JobSet")]
        # Should the kernel die, its engines end (no more heartbeats), the pods end a
        # lease's TTL later, the Job finishes, and the cluster deletes it after the TTL:
        # the Secret and Service are its own.
        top["spec"]["ttlSecondsAfterFinished"] = ttl
        # The last world's pods say nothing of this one's: the next look lists them anew.
        self.manifests, self.name, self._pods, self._last_poll = manifests, name, {}, 0.0
        self.top_kind = top["kind"]
        owner = self.kernel_owner()
        if owner is not None:
            # A deleted kernel pod takes its world with it at once, not after the TTL.
            top["metadata"]["ownerReferences"] = [owner]
        [uid] = api.create(self.client, [top])
        rest = [m for m in manifests if m is not top]
        for m in rest:
            m["metadata"]["ownerReferences"] = [api.owned_by(top, uid)]
        # Pods wait for their Secret (a kubelet retries the mount until it exists).
        api.create(self.client, rest)

    def attach(self, job_id: str, files: Mapping[str, bytes]) -> str | None:
        """Run this kernel's generation ``files`` in the pods of the kept world
        ``job_id`` (``namespace/name``); returns a note when the pods could not be told
        at once.

        Raises
        ------
        ClusterStartError
            When the world is gone, was not kept (a kernel runs on it), another kernel
            took it first, or its pods are not the cluster's processes.
        """
        namespace, name = split_job_id(job_id)
        self.namespace = namespace
        secret = api.read_secret(self.client, namespace, secret_name(name))
        if secret is None:
            raise ClusterStartError(
                f"no Kubernetes world {name} in namespace {namespace}: it was deleted, or "
                "its pods ended when nobody attached within its wait; start a new cluster "
                "(%jaxsys start --launcher kubernetes ...)"
            )
        if (secret["metadata"].get("labels") or {}).get(KEPT_LABEL) != "true":
            raise ClusterStartError(
                f"the Kubernetes world {name} is not kept: a kernel runs a cluster on it. "
                "Stop that cluster with %jaxsys stop --keep-allocation, or start a new one"
            )
        pods = self._running_pods(name)
        owner = (secret["metadata"].get("ownerReferences") or [{}])[0]
        self.top_kind = owner.get("kind", "Job")
        top_api = owner.get("apiVersion", "batch/v1")
        if not self._write(secret, files, kept=False):
            raise ClusterStartError(
                f"another kernel took the Kubernetes world {name} first; start a new "
                "cluster (%jaxsys start --launcher kubernetes ...)"
            )
        self.name, self._pods, self._last_poll = name, {}, 0.0
        self.manifests = [
            _named("v1", "Secret", secret_name(name), namespace),
            _named("v1", "Service", name, namespace),
            _named(top_api, self.top_kind, name, namespace),
        ]
        notes = [self._nudge(pods, files[GENERATION].decode()), self._adopt()]
        return "; ".join(n for n in notes if n) or None

    def _top(self, manifests: Sequence[Mapping[str, Any]] | None) -> Mapping[str, Any] | None:
        return next((m for m in manifests or () if m["kind"] in ("Job", "JobSet")), None)

    def _adopt(self) -> str | None:
        """Where the attaching kernel runs in a pod, it owns the world from now on; a note
        saying so, or why not."""
        owner, top = self.kernel_owner(), self._top(self.manifests)
        if owner is None or top is None:
            return self.owner_note or None
        return owner_of.adopt(self.client, top, owner, self.owner_note or "")

    def _running_pods(self, name: str) -> list:
        """The pods of the kept world ``name``, checked to be this cluster's processes."""
        pods = api.pods(self.client, self.namespace, name)
        running = [p for p in pods if p.status.phase == "Running"]
        if len(running) != len(pods) or not pods:
            ended = sorted(p.metadata.name for p in pods if p not in running)
            raise ClusterStartError(
                f"the Kubernetes world {name} has {len(running)} running pods"
                + (f" ({', '.join(ended)} not running)" if ended else "")
                + ": nothing to attach to; start a new cluster"
            )
        if len(pods) != self.nprocs:
            raise ClusterStartError(
                f"the Kubernetes world {name} has {len(pods)} pods, not {self.nprocs}: "
                f"attach with --hosts {len(pods)}"
            )
        jobs = {(p.metadata.labels or {}).get(api.JOB_INDEX_LABEL) for p in pods}
        self.per_job = len(pods) // len(jobs)
        return pods

    def keep(self) -> None:
        """Keep the running world for the next kernel: its Secret's generation becomes
        one without an engine (its pods end their engines and wait the lease's TTL for
        an attach), labelled :data:`KEPT_LABEL`; this cluster forgets it. A failure is
        said on stderr: the pods then end a lease's TTL after their engines."""
        # Deferred: the kubernetes extra, as in kubernetes_api.
        from kubernetes.client.rest import ApiException

        name, manifests, self.manifests, self.name = self.name, self.manifests, None, None
        if name is None:
            return
        kept = {GENERATION: f"kept-{secrets.token_hex(6)}".encode(), **wait_file()}
        try:
            secret = api.read_secret(self.client, self.namespace, secret_name(name))
            if secret is not None and self._write(secret, kept, kept=True):
                pods = api.pods(self.client, self.namespace, name)
                note = self._nudge(pods, kept[GENERATION])
                if note:
                    print(f"jaxsys: {note}", file=sys.stderr)
                if self._owner is not None and (top := self._top(manifests)) is not None:
                    owner_of.disown(self.client, top, name)  # a kept world outlives its pod
                return
            why = "it is gone" if secret is None else "another kernel wrote its Secret"
        except (ApiException, OSError) as e:
            why = api.failure(e)
        print(f"jaxsys: could not keep the Kubernetes world {name}: {why}", file=sys.stderr)

    def end_engines(self) -> str | None:
        """For a world restart in the living pods: a generation without an engine ends
        each pod's engine (with its process group); the pods wait for the next
        generation (:meth:`renew`). Returns why the pods cannot serve the next world (a
        pod is gone, or the Secret, or the API failed on the way), and then the world is
        made anew."""
        from kubernetes.client.rest import ApiException  # Deferred: as in keep

        try:
            pods = api.pods(self.client, self.namespace, self.name)
            why = not_reusable(pods, self.nprocs, self.per_job)
            if why is not None:
                return why
            secret = api.read_secret(self.client, self.namespace, secret_name(self.name))
            if secret is None:
                return f"its Secret {secret_name(self.name)} is gone"
            ended = {GENERATION: f"{RESTART_PREFIX}{secrets.token_hex(6)}".encode()}
            if not self._write(secret, {**ended, **wait_file()}, kept=False):
                return "its Secret was changed by someone else"
        except (ApiException, OSError) as e:
            # Whether the pods saw the end is unknown: only new pods are sure to be clean.
            return f"the Kubernetes API failed ({api.failure(e)})"
        self.nudge_note = self._nudge(pods, ended[GENERATION])
        return None

    def renew(self, files: Mapping[str, bytes]) -> str | None:
        """Run generation ``files`` (this kernel's next world) in the pods whose engines
        :meth:`end_engines` ended; returns a note when the pods could not be told at once.

        Raises
        ------
        ClusterStartError
            When the Secret is gone or was changed by someone else meanwhile.
        """
        secret = api.read_secret(self.client, self.namespace, secret_name(self.name))
        if secret is None or not self._write(secret, files, kept=False):
            raise ClusterStartError(
                f"the Secret of the Kubernetes world {self.name} was deleted or changed "
                "during the restart; restart again (the world is then made anew)"
            )
        pods = api.pods(self.client, self.namespace, self.name)
        return self._nudge(pods, files[GENERATION])

    def _write(self, secret: dict[str, Any], files: Mapping[str, bytes], kept: bool) -> bool:
        """Replace the Secret's files with ``files`` and, unless it is kept, the standby
        engines' (:attr:`standby`), labelled kept or not; False when it changed since it
        was read."""
        labels = dict(secret["metadata"].get("labels") or {})
        labels.pop(KEPT_LABEL, None)
        if kept:
            labels[KEPT_LABEL] = "true"
            self._forget_standby()  # the pods end them: a kept world runs no engine
        elif self.standby:
            entries = {k: v for _, entry in self.standby.values() for k, v in entry.items()}
            files = {**self.standby_files, **entries, **files}
        secret["metadata"]["labels"] = labels
        secret["data"] = {k: base64.b64encode(v).decode() for k, v in sorted(files.items())}
        return api.replace_secret(self.client, secret)

    def write_standby(self) -> str | None:
        """Write the standby engines' entries (:attr:`standby`) into the Secret beside its
        generation, so that each pod starts (or ends) its own; a note when the pods could
        not be told at once.

        Raises
        ------
        ClusterError
            When the world's Secret is gone or was changed by someone else meanwhile.
        """
        secret = api.read_secret(self.client, self.namespace, secret_name(self.name))
        if secret is not None:
            data = secret.get("data") or {}
            files = {
                k: base64.b64decode(v) for k, v in data.items() if not k.startswith(STANDBY_PREFIX)
            }
            if self._write(secret, files, kept=False):
                pods = api.pods(self.client, self.namespace, self.name)
                gen = files.get(GENERATION, b"").decode()
                return self._nudge(pods, f"{gen}+standby-{secrets.token_hex(3)}")
        raise ClusterError(
            f"the Secret of the Kubernetes world {self.name} was deleted or changed while "
            "its standby engines were written; %jaxsys restart makes them again"
        )

    def _forget_standby(self) -> None:
        self.standby.clear()
        self.standby_files = {}

    def drop_standby(self, set_ids: set[str]) -> None:
        """Forget the standby entries of these engine sets (they serve the world now)."""
        for rank in [r for r, (set_id, _) in self.standby.items() if set_id in set_ids]:
            del self.standby[rank]

    def _nudge(self, pods: Sequence[Any], gen: str | bytes) -> str | None:
        """Annotate the pods with the generation, so that the kubelet projects the new
        Secret at once; a note when it could not."""
        gen = gen.decode() if isinstance(gen, bytes) else gen
        failed = []
        for pod in pods:
            try:
                api.annotate(self.client, pod, GENERATION_ANNOTATION, gen)
            except Exception as e:  # noqa: BLE001 - named below; the pods still see it later
                failed.append(f"{pod.metadata.name} ({api.failure(e)})")
        if not failed:
            return None
        return (
            f"could not annotate pods {', '.join(failed)}: they see the world's new Secret "
            "at the kubelet's next sync, up to a minute later; allow the kernel to patch pods"
        )

    def kernel_owner(self) -> dict[str, Any] | None:
        """The ownerReference to the kernel's own pod every world gets (looked up once;
        ``owner_note`` says what was found)."""
        if self.owner_note is None:
            self._owner, self.owner_note = api.own_pod_owner(self.client, self.namespace)
        return self._owner

    def wait_running(self, report: Callable[[str, int, int], None], timeout: float) -> None:
        """Wait until every pod runs, reporting how many do and why the others wait.

        Raises
        ------
        ClusterStartError
            When a pod ends, or they do not all run within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        said = None
        while True:
            pods = api.pods(self.client, self.namespace, self.name)
            running = [p for p in pods if p.status.phase == "Running"]
            for p in pods:
                if p.status.phase in ("Failed", "Succeeded"):
                    raise ClusterStartError(
                        f"pod {p.metadata.name} ended before its engine joined: "
                        f"{api.why_ended(p)}; see kubectl logs -n {self.namespace} "
                        f"{p.metadata.name}"
                    )
            if len(running) == self.nprocs:
                # What the cluster's liveness checks start from.
                self._pods = {api.rank(p, self.per_job): p for p in pods}
                self._last_poll = time.monotonic()
                return
            reasons = sorted({why for p in pods if (why := api.why_pending(p))})
            text = f"Kubernetes world {self.name}: {len(running)} of {self.nprocs} pods running"
            if reasons:
                text += f" ({'; '.join(reasons)})"
            if text != said:
                report(text, len(running), self.nprocs)
                said = text
            if time.monotonic() > deadline:
                raise ClusterStartError(
                    f"{text} after {timeout:g} s; see kubectl describe pods -n "
                    f"{self.namespace} -l jaxsys.dev/world={self.name}"
                )
            time.sleep(START_POLL_S)

    def delete(self) -> bool:
        """Delete the running world and wait (bounded) until its pods are gone; whether
        they are (True too when there was no world)."""
        manifests, name, self.manifests, self.name = self.manifests, self.name, None, None
        self._forget_standby()  # they go with the pods
        if not manifests:
            return True
        api.delete(self.client, manifests)
        return api.wait_gone(self.client, self.namespace, name, DELETE_WAIT_S)

    def pod_of(self, rank: int, refresh: bool = True):
        """The pod of process ``rank`` (looked up at most every :data:`RUN_POLL_S`), or
        None when the world has no such pod."""
        now = time.monotonic()
        if refresh and self.name and now - self._last_poll > RUN_POLL_S:
            self._last_poll = now
            try:
                found = api.pods(self.client, self.namespace, self.name)
            except OSError:
                return self._pods.get(rank)
            self._pods = {api.rank(p, self.per_job): p for p in found}
        return self._pods.get(rank)


def not_reusable(pods: Sequence[Any], nprocs: int, per_job: int) -> str | None:
    """Why a world's ``pods`` cannot run its next world in place (a pod of a process is
    gone, ended, being deleted or not running), or None when every process's pod runs."""
    by_rank = {api.rank(p, per_job): p for p in pods}
    missing = [r for r in range(nprocs) if r not in by_rank]
    if missing:
        return f"the pod of process {missing[0]} is gone"
    for r in range(nprocs):
        pod = by_rank[r]
        if getattr(pod.metadata, "deletion_timestamp", None):
            return f"pod {pod.metadata.name} (process {r}) is being deleted"
        if pod.status.phase in ("Failed", "Succeeded"):
            return f"pod {pod.metadata.name} (process {r}) ended: {api.why_ended(pod)}"
        if pod.status.phase != "Running":
            return f"pod {pod.metadata.name} (process {r}) is {pod.status.phase}"
    return None
