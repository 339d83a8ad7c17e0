"""A notebook's cluster on Kubernetes: each world's engines as the pods of one Job.

The kernel keeps its ipyparallel controller; a world is the launcher's manifests
(:func:`~.kubernetes.world_manifests`) with, in its Secret, what an engine needs to join
that controller: the controller's engine connection file (with its CurveZMQ keys), the
engines' ipyparallel config, and every process's certificate and key for mTLS. Pods run
``python -m ipyparallel.engine`` against those files; pod *i* is process *i* (its Job's
completion index). Nothing of the kernel's filesystem is needed in the pods.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..profile import controller_file
from ..records import ClusterStartError
from . import kubernetes_api as api
from .kubernetes_manifests import CREDENTIALS_DIR, world_manifests, world_name

#: Names of the files in a world's Secret besides certificates and keys.
ENGINE_FILE = "ipcontroller-engine.json"
ENGINE_CONFIG = "ipengine_config.py"
# Seconds between looks at the pods while they start, and while the cluster runs.
START_POLL_S = 0.2
RUN_POLL_S = 2.0
# Seconds a world's deletion waits for its pods to be gone.
DELETE_WAIT_S = 15.0
# A finished Job (its engines gone because the kernel died) is deleted by the cluster
# this long after, and its Secret and Service with it (launcher option ttl_after_finished).
TTL_AFTER_FINISHED_S = 60


def engine_command(python: str, args: Sequence[str] = ()) -> list[str]:
    """What each pod runs: an ipyparallel engine (with ``args``) in a profile of its own,
    made in the pod's temporary directory from the config in the Secret."""
    creds = shlex.quote(CREDENTIALS_DIR)
    script = (
        'P="$(mktemp -d "${TMPDIR:-/tmp}/jaxsys-engine-XXXXXX")" && '
        f'cp {creds}/{ENGINE_CONFIG} "$P/" && '
        'exec "$0" -m ipyparallel.engine --profile-dir="$P" '
        f'--IPEngine.url_file={creds}/{ENGINE_FILE} "$@"'
    )
    return ["/bin/sh", "-c", script, python, *args]


def credential_files(pki) -> dict[str, Path]:
    """Every certificate and key of a world's processes, and the CA's certificate, by the
    file name they get in the Secret."""
    files: dict[str, Path] = {}
    for i in range(pki.nprocs):
        creds = pki.credentials(i)
        for path in (creds.cert_file, creds.key_file, creds.ca_file):
            files[Path(path).name] = Path(path)
    return files


def pod_env(env: Mapping[str, str], pki, profile: Path | None) -> dict[str, str]:
    """The engines' environment as the pods see it: certificate paths point into the
    mounted Secret, and nothing names a file of the kernel's profile."""
    dirs = set()
    if pki is not None:
        dirs = {str(pki.cert_dir), str(Path(pki.ca_file).parent)}
    out = {}
    for k, v in env.items():
        parent = str(Path(v).parent) if v.startswith("/") else None
        if parent in dirs:
            out[k] = f"{CREDENTIALS_DIR}/{Path(v).name}"
        elif profile is not None and v.startswith(f"{profile}/"):
            continue  # a file of the kernel's machine: the engine makes its own
        else:
            out[k] = v
    return out


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
        # The kernel's own pod as the owner of every world, once looked up.
        self._owner: dict[str, Any] | None = None
        self.owner_note: str | None = None

    @property
    def client(self):
        if self._api is None:
            self._api = api.api_client(self.options.get("kubeconfig"))
        return self._api

    def make(
        self, cluster_id: str, incarnation: int, env, pki, profile: Path, timeout, args=()
    ) -> None:
        """Create world ``incarnation``, whose engines run with ``args``: its Secret (with
        the controller's engine file, once the controller has written it), Service and
        Job."""
        name = world_name(cluster_id, incarnation)
        files = {ENGINE_FILE: _engine_file(profile, cluster_id, timeout).encode()}
        files[ENGINE_CONFIG] = (profile / ENGINE_CONFIG).read_bytes()
        if pki is not None:
            files.update({k: p.read_bytes() for k, p in credential_files(pki).items()})
        python = self.options.get("python") or "python3"
        manifests = world_manifests(
            name,
            self.nprocs,
            engine_command(python, args),
            self.options,
            env=pod_env(env, pki, profile),
            credentials=files,
        )
        ttl = int(self.options.get("ttl_after_finished", TTL_AFTER_FINISHED_S))
        [top] = [m for m in manifests if m["kind"] in ("Job", "JobSet")]
        # Should the kernel die, its engines end (no more heartbeats), the Job finishes,
        # and the cluster deletes it after the TTL: the Secret and Service are its own.
        top["spec"]["ttlSecondsAfterFinished"] = ttl
        # The last world's pods say nothing of this one's: the next look lists them anew.
        self.manifests, self.name, self._pods, self._last_poll = manifests, name, {}, 0.0
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

    def delete(self) -> None:
        """Delete the running world and wait (bounded) until its pods are gone."""
        manifests, name, self.manifests, self.name = self.manifests, self.name, None, None
        if not manifests:
            return
        api.delete(self.client, manifests)
        api.wait_gone(self.client, self.namespace, name, DELETE_WAIT_S)

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


def _engine_file(profile: Path, cluster_id: str, timeout: float) -> str:
    """The controller's engine connection file, once the controller has filled it in."""
    src = controller_file(profile, cluster_id, "engine")
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = src.read_text()
            json.loads(text)
            return text
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise ClusterStartError(
                    f"the controller did not write {src} within {timeout:g} s"
                ) from None
            time.sleep(0.02)


def in_cluster_address() -> str | None:
    """This pod's IP when the kernel runs in a Kubernetes pod (engines reach it there)."""
    if not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    return os.environ.get("POD_IP") or None
