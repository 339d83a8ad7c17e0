"""``jaxsys job --launcher kubernetes``: run a job's program as one Kubernetes world.

``python -m jaxsys_kernel.cluster.launchers.kubernetes_job N OPTIONS PROGRAM``, run in the
job's folder: writes the world's manifests to ``world.yaml``, creates them (with the
kubeconfig of ``$KUBECONFIG``, ``~/.kube/config``, or the pod's service account), waits
until every pod has ended, writes pod *i*'s log to ``p<i>.out`` and deletes the world,
also when it is stopped (SIGTERM, SIGINT). The pods run ``<python> <PROGRAM>`` in this
folder, so the folder must be at the same path in the pods (a shared volume in the pod
template).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ...errors import JaxsysError
from . import kubernetes_api
from .kubernetes_manifests import WORLD_LABEL, dump, world_manifests, world_name

POLL_S = 0.5
_DONE = ("Succeeded", "Failed")


class Stopped(JaxsysError):
    """SIGTERM or SIGINT arrived."""


def _stop(signum, frame):
    raise Stopped(signal.Signals(signum).name)


def _ended(job) -> bool:
    conditions = (job.status.conditions if job.status else None) or []
    return any(c.type in ("Failed", "Complete") and c.status == "True" for c in conditions)


def _wait_and_collect(api_client, name: str, ns: str, nprocs: int, per_job: int) -> int:
    """Wait until the world's pods have ended; write their logs; the job's exit code."""
    from kubernetes import client  # Deferred: the kubernetes extra, only for a job

    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    selector = f"{WORLD_LABEL}={name}"
    # Until the job's timeout (run_job's) ends this process, if the pods never end.
    while True:
        pods = core.list_namespaced_pod(ns, label_selector=selector).items
        if all(p.status.phase in _DONE for p in pods):
            if len(pods) >= nprocs:
                break
            # A failed Job's controller deletes its other pods rather than ending them.
            jobs = batch.list_namespaced_job(ns, label_selector=selector).items
            if any(_ended(j) for j in jobs):
                break
        time.sleep(POLL_S)
    code = 0 if len(pods) >= nprocs else 1
    for pod in pods:
        log = core.read_namespaced_pod_log(pod.metadata.name, ns)
        Path(f"p{kubernetes_api.rank(pod, per_job)}.out").write_text(log)
        if pod.status.phase != "Succeeded":
            code = 1
    return code


def run(nprocs: int, options: dict[str, Any], program: str) -> int:
    """Make, run and delete the world; returns 0 when every process succeeded."""
    name = world_name(f"job-{secrets.token_hex(3)}")
    command = [options.get("python") or "python3", os.path.abspath(program)]
    manifests = world_manifests(name, nprocs, command, options)
    for m in manifests:
        spec = m["spec"] if m["kind"] == "Job" else None
        if m["kind"] == "JobSet":
            spec = m["spec"]["replicatedJobs"][0]["template"]["spec"]
        if spec is not None:
            spec["template"]["spec"]["containers"][0]["workingDir"] = os.getcwd()
    Path("world.yaml").write_text(dump(manifests))
    api_client = kubernetes_api.api_client(options.get("kubeconfig"))
    per_job = nprocs // int(options.get("replicas", 1))
    old = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        kubernetes_api.create(api_client, manifests)
        return _wait_and_collect(
            api_client, name, manifests[0]["metadata"]["namespace"], nprocs, per_job
        )
    except Stopped as e:
        print(f"jaxsys job: stopped by {e}; deleting world {name}", file=sys.stderr)
        return 143
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        kubernetes_api.delete(api_client, manifests, "jaxsys job")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print(
            "usage: python -m jaxsys_kernel.cluster.launchers.kubernetes_job N OPTIONS PROGRAM",
            file=sys.stderr,
        )
        return 2
    return run(int(args[0]), json.loads(args[1]), args[2])


if __name__ == "__main__":
    sys.exit(main())
