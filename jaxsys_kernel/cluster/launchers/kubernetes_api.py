"""The few Kubernetes API calls a world needs: make it, read its pods, delete it.

Every function takes an API client of the ``kubernetes`` package (:func:`api_client`) and
imports that package only when called: it is an extra, needed only where worlds run on
Kubernetes.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from .kubernetes_manifests import JOB_INDEX_LABEL, WORLD_LABEL

#: The label an Indexed Job puts on each pod: its completion index.
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
#: Where a pod's service account names the pod's namespace.
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
# What a world's first start imports of the kubernetes package (warm_up).
_WARM_MODULES = (
    "kubernetes.config",
    "kubernetes.utils",
    "kubernetes.client.api.core_v1_api",
    "kubernetes.client.api.batch_v1_api",
    "kubernetes.client.api.custom_objects_api",
)
# Seconds between looks at a world's pods while it is deleted.
_GONE_POLL_S = 0.1


def warm_up(environ: Mapping[str, str] = os.environ) -> threading.Thread | None:
    """Import the ``kubernetes`` package in the background where a cluster is configured.

    Importing it takes over a second of CPU (its API models); a kernel started where
    ``KUBECONFIG`` is set, or inside a pod, is likely to start a world on Kubernetes, and
    pays that while it waits for its first cell rather than inside ``%jaxsys start``.
    Returns the thread, or None where nothing names a cluster or the package is absent.
    """
    if not (environ.get("KUBECONFIG") or environ.get("KUBERNETES_SERVICE_HOST")):
        return None
    if importlib.util.find_spec("kubernetes") is None:
        return None

    def load() -> None:
        with contextlib.suppress(Exception):
            # The package loads its API classes (and their models) only when first named.
            for name in _WARM_MODULES:
                importlib.import_module(name)

    thread = threading.Thread(target=load, name="jaxsys-kubernetes-import", daemon=True)
    thread.start()
    return thread


def api_client(kubeconfig: str | None = None):
    """A client of the cluster named by ``kubeconfig``, ``$KUBECONFIG`` or
    ``~/.kube/config``; inside a pod without one, of the pod's own cluster."""
    from kubernetes import client, config  # Deferred: the kubernetes extra

    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path or Path("~/.kube/config").expanduser().exists():
        return config.new_client_from_config(config_file=path)
    try:
        config.load_incluster_config()
    except config.ConfigException as e:
        raise ConfigError(
            f"no Kubernetes cluster is named here ({e}): set KUBECONFIG, give "
            "--kubeconfig FILE, or run the kernel in a pod of the cluster"
        ) from None
    return client.ApiClient()


def create(api, manifests: Sequence[Mapping[str, Any]]) -> list[str]:
    """Create each object, in order, as ``kubectl create -f`` would; their uids."""
    from kubernetes import client, utils  # Deferred: as in api_client

    uids = []
    for m in manifests:
        if m["kind"] == "JobSet":
            group, version = m["apiVersion"].split("/")
            made = client.CustomObjectsApi(api).create_namespaced_custom_object(
                group, version, m["metadata"]["namespace"], "jobsets", dict(m)
            )
            uids.append(made["metadata"]["uid"])
        else:
            [made] = utils.create_from_dict(api, dict(m))
            uids.append(made.metadata.uid)
    return uids


def owned_by(manifest: Mapping[str, Any], uid: str) -> dict[str, Any]:
    """An ownerReference to the object ``manifest`` made (its ``uid``): what it owns is
    deleted with it by the cluster's garbage collector."""
    return {
        "apiVersion": manifest["apiVersion"],
        "kind": manifest["kind"],
        "name": manifest["metadata"]["name"],
        "uid": uid,
    }


def own_pod_name() -> tuple[str, str | None] | None:
    """``(name, namespace)`` of the pod this process runs in, or None outside one.

    The name comes from ``$POD_NAME`` (the downward API; docs/clusters.md's kernel pod sets
    it), else from the hostname when ``$KUBERNETES_SERVICE_HOST`` says this is a pod; the
    namespace from ``$POD_NAMESPACE`` or the pod's service account (None when unknown).
    """
    name = os.environ.get("POD_NAME")
    if not name and os.environ.get("KUBERNETES_SERVICE_HOST"):
        name = os.environ.get("HOSTNAME") or os.uname().nodename
    if not name:
        return None
    namespace = os.environ.get("POD_NAMESPACE")
    if not namespace:
        try:
            namespace = Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip() or None
        except OSError:
            namespace = None
    return name, namespace


def own_pod_owner(api, namespace: str) -> tuple[dict[str, Any] | None, str]:
    """An ownerReference to this process's own pod, for objects made in ``namespace``, and
    a line saying what was found (the reference is None when there is none to make; the line
    is empty outside a pod).

    Owners must live in their objects' namespace, so a pod of another namespace owns
    nothing; a pod the API does not show (no right to read it) neither.
    """
    from kubernetes import client  # Deferred: as in api_client
    from kubernetes.client.rest import ApiException  # Deferred: as in api_client

    found = own_pod_name()
    if found is None:
        return None, ""  # outside the cluster: nothing to say
    name, pod_ns = found
    if pod_ns is not None and pod_ns != namespace:
        return None, (
            f"the kernel's pod {name} is in namespace {pod_ns}, the world in {namespace}: "
            "an owner must share its objects' namespace, so the world has none"
        )
    try:
        pod = client.CoreV1Api(api).read_namespaced_pod(name, namespace)
    except ApiException as e:
        return None, f"the kernel's pod {name} could not be read ({e.status} {e.reason})"
    ref = {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod.metadata.uid}
    return ref, f"owned by the kernel's pod {name}: deleting it deletes the world"


def failure(e: BaseException) -> str:
    """What an API call's error says in one phrase: the API's reason (``Forbidden``), else
    the error itself (an unreachable server)."""
    return str(getattr(e, "reason", None) or e)


def set_owner(api, top: Mapping[str, Any], owner: Mapping[str, Any] | None) -> None:
    """Make ``owner`` (an ownerReference, None: nobody) the only owner of a world's Job or
    JobSet ``top`` (a manifest naming it): the garbage collector deletes it with its owner.

    A JSON patch replaces the whole list, as a strategic merge patch (which merges owner
    references by uid) would not.
    """
    from kubernetes import client  # Deferred: as in api_client

    name, ns = top["metadata"]["name"], top["metadata"]["namespace"]
    op = [{"op": "add", "path": "/metadata/ownerReferences", "value": [owner] if owner else []}]
    if top["kind"] == "JobSet":
        group, version = top["apiVersion"].split("/")
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            group, version, ns, "jobsets", name, op
        )
    else:
        client.BatchV1Api(api).patch_namespaced_job(name, ns, op)


def delete(api, manifests: Sequence[Mapping[str, Any]], who: str = "jaxsys") -> None:
    """Delete every object (a Job's pods with it, in the foreground); those already gone
    are skipped, other failures are named on stderr and the rest still deleted."""
    from kubernetes import client  # Deferred: as in api_client

    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    custom = client.CustomObjectsApi(api)
    for m in reversed(manifests):
        name, ns, kind = m["metadata"]["name"], m["metadata"]["namespace"], m["kind"]
        try:
            if kind == "Job":
                batch.delete_namespaced_job(name, ns, propagation_policy="Foreground")
            elif kind == "JobSet":
                group, version = m["apiVersion"].split("/")
                custom.delete_namespaced_custom_object(
                    group, version, ns, "jobsets", name, propagation_policy="Foreground"
                )
            elif kind == "Service":
                core.delete_namespaced_service(name, ns)
            elif kind == "Secret":
                core.delete_namespaced_secret(name, ns)
        except client.exceptions.ApiException as e:
            if e.status != 404:
                print(f"{who}: could not delete {kind} {name}: {e.reason}", file=sys.stderr)
        except OSError as e:  # the API server is unreachable: say so, go on
            print(f"{who}: could not delete {kind} {name}: {e}", file=sys.stderr)


def read_secret(api, namespace: str, name: str):
    """The Secret ``name`` as a dict, or None when there is none."""
    from kubernetes import client  # Deferred: as in api_client
    from kubernetes.client.rest import ApiException  # Deferred: as in api_client

    try:
        found = client.CoreV1Api(api).read_namespaced_secret(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return api.sanitize_for_serialization(found)


def replace_secret(api, secret: Mapping[str, Any]) -> bool:
    """Replace a Secret read with :func:`read_secret` (its ``resourceVersion`` kept);
    False when it changed since it was read (someone else wrote it first)."""
    from kubernetes import client  # Deferred: as in api_client
    from kubernetes.client.rest import ApiException  # Deferred: as in api_client

    meta = secret["metadata"]
    try:
        client.CoreV1Api(api).replace_namespaced_secret(
            meta["name"], meta["namespace"], dict(secret)
        )
    except ApiException as e:
        if e.status == 409:
            return False
        raise
    return True


def annotate(api, pod, key: str, value: str) -> None:
    """Set one annotation of a pod (a JSON patch, as every client version sends it)."""
    from kubernetes import client  # Deferred: as in api_client

    if pod.metadata.annotations:
        pointer = key.replace("~", "~0").replace("/", "~1")
        op = {"op": "add", "path": f"/metadata/annotations/{pointer}", "value": value}
    else:
        op = {"op": "add", "path": "/metadata/annotations", "value": {key: value}}
    client.CoreV1Api(api).patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace, [op])


def pods(api, namespace: str, world: str) -> list:
    """The pods of one world (every Job of it)."""
    from kubernetes import client  # Deferred: as in api_client

    selector = f"{WORLD_LABEL}={world}"
    return client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items


def wait_gone(api, namespace: str, world: str, timeout: float) -> bool:
    """Wait (at most ``timeout`` seconds) until no pod of the world is left."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if not pods(api, namespace, world):
                return True
        except OSError:
            return False
        if time.monotonic() > deadline:
            return False
        time.sleep(_GONE_POLL_S)


def rank(pod, per_job: int) -> int:
    """The process a pod runs: ``job index * processes per Job + completion index``."""
    labels = pod.metadata.labels or {}
    return int(labels.get(JOB_INDEX_LABEL, 0)) * per_job + int(labels[INDEX_LABEL])


def why_pending(pod) -> str | None:
    """Why a pod does not run yet, as the cluster says it (``Unschedulable: 0/3 nodes ...``,
    ``ErrImagePull``), or None when it gives no reason."""
    status = pod.status
    for c in (status.conditions if status else None) or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason:
            return f"{c.reason}: {c.message}" if c.message else c.reason
    for cs in (status.container_statuses if status else None) or []:
        waiting = cs.state.waiting if cs.state else None
        if waiting is not None and waiting.reason:
            return f"{waiting.reason}: {waiting.message}" if waiting.message else waiting.reason
    return None


def why_ended(pod) -> str:
    """How an ended pod ended: its phase, and its container's reason and exit code."""
    status = pod.status
    parts = [status.phase or "gone"]
    if status.message:
        parts.append(status.message)
    for cs in status.container_statuses or []:
        term = cs.state.terminated if cs.state else None
        if term is not None:
            parts.append(f"{term.reason or 'exited'}, exit code {term.exit_code}")
    return "; ".join(parts)
