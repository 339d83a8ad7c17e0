"""JAX's own Kubernetes detection, end to end, in the hermetic test cluster.

The launcher's manifests are created through the real Kubernetes client against
:mod:`tests.k8s_api` over TLS; :mod:`tests.k8s_kubelet` runs each pod as a process with the
pod's hostname, DNS, service account and environment, and the pods' ``jax.distributed.
initialize()`` (no arguments) finds its process count, id and coordinator from the API.
"""

from __future__ import annotations

import json
import socket
import sys
import time

import pytest

from jaxsys_kernel.cluster.launchers.kubernetes import CREDENTIALS_DIR, world_manifests
from tests.k8s_kubelet import running

pytestmark = [pytest.mark.live, pytest.mark.timeout(180)]


# What every pod runs: JAX finds the world itself (or, in a JobSet of several Jobs, from
# the ids and coordinator the launcher gives), then sums one value per process.
PROGRAM = r"""
import hashlib, json, os
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
from jax._src import distributed
if "JAXSYS_PROCESS_ID" in os.environ:
    jax.distributed.initialize(
        process_id=int(os.environ["JAXSYS_PROCESS_ID"]),
        num_processes=int(os.environ["JAXSYS_NUM_PROCESSES"]),
        initialization_timeout=90,
    )
else:
    jax.distributed.initialize(initialization_timeout=90)
import jax.numpy as jnp
total = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")(
    jnp.array([float(jax.process_index() + 1)])
)
cred = open(os.path.join(os.environ["CREDS"], "token")).read()
print("RESULT " + json.dumps({
    "index": jax.process_index(), "count": jax.process_count(),
    "devices": jax.device_count(), "sum": float(total[0]),
    "coordinator": distributed.global_state.coordinator_address,
    "hostname": os.uname().nodename, "credential": hashlib.sha256(cred.encode()).hexdigest(),
}), flush=True)
jax.distributed.shutdown()
"""
DEADLINE_S = 150


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@pytest.fixture
def k8s():
    with running(own_python=False) as cluster:
        yield cluster


@pytest.fixture
def client(k8s, tmp_path):
    kubernetes = pytest.importorskip("kubernetes")
    conf = k8s.api.kubeconfig(tmp_path / "kubeconfig")
    return kubernetes.config.new_client_from_config(config_file=str(conf))


def apply(api_client, manifests) -> None:
    """Create each object as ``kubectl create -f`` would, through the real client."""
    from kubernetes import client, utils

    for m in manifests:
        if m["kind"] == "JobSet":
            group, version = m["apiVersion"].split("/")
            client.CustomObjectsApi(api_client).create_namespaced_custom_object(
                group, version, m["metadata"]["namespace"], "jobsets", m
            )
        else:
            utils.create_from_dict(api_client, m)


def wait_results(k8s, n: int, namespace: str = "default") -> list[dict]:
    """Every pod's RESULT line once all ``n`` pods have ended (their logs on failure)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        pods = k8s.api.list("Pod", namespace)
        phases = [p["status"]["phase"] for p in pods]
        if len(pods) == n and all(ph in ("Succeeded", "Failed") for ph in phases):
            break
        time.sleep(0.2)
    logs = {name: pod.read_log() for name, pod in k8s.pods.items()}
    assert phases == ["Succeeded"] * n, json.dumps(logs, indent=1)[-6000:]
    results = []
    for log in logs.values():
        [line] = [x for x in log.splitlines() if x.startswith("RESULT ")]
        results.append(json.loads(line[len("RESULT ") :]))
    return sorted(results, key=lambda r: r["index"])


def world(n, options, token=b"world-secret"):
    port = _free_port()
    opts = {"image": "unused-by-the-test-kubelet", "coordinator_port": port, **options}
    cmd = [sys.executable, "-c", PROGRAM]
    env = {"CREDS": CREDENTIALS_DIR}
    return port, world_manifests("w", n, cmd, opts, env=env, credentials={"token": token})


def test_jax_finds_an_indexed_job_world_through_the_api_and_sums_across_pods(k8s, client):
    import hashlib

    port, manifests = world(2, {})
    apply(client, manifests)
    results = wait_results(k8s, 2)
    assert [(r["index"], r["count"], r["devices"]) for r in results] == [(0, 2, 2), (1, 2, 2)]
    assert [r["sum"] for r in results] == [3.0, 3.0]
    assert [r["hostname"] for r in results] == ["w-0", "w-1"]
    assert {r["coordinator"] for r in results} == {f"w-0.w:{port}"}
    assert {r["credential"] for r in results} == {hashlib.sha256(b"world-secret").hexdigest()}
    # JAX found its pod by its IP, and its Job by the pod's label, through the API.
    paths = [p for _, p in k8s.api.requests]
    assert sum("fieldSelector=status.podIP" in p for p in paths) >= 2
    assert sum(p == "/apis/batch/v1/namespaces/default/jobs/w" for p in paths) >= 2
    job = k8s.api.get("Job", "default", "w")
    assert job["status"]["succeeded"] == 2
    assert job["status"]["conditions"][0]["type"] == "Complete"


def test_two_job_jobset_gets_unique_ids_and_one_coordinator(k8s, client):
    port, manifests = world(4, {"kind": "jobset", "replicas": 2})
    apply(client, manifests)
    results = wait_results(k8s, 4)
    assert [(r["index"], r["count"]) for r in results] == [(i, 4) for i in range(4)]
    assert {r["sum"] for r in results} == {10.0}
    assert {r["coordinator"] for r in results} == {f"w-engines-0-0.w:{port}"}
    assert [r["hostname"] for r in results] == [
        f"w-engines-{j}-{i}" for j in (0, 1) for i in (0, 1)
    ]


def test_deleting_the_job_ends_its_pods(k8s, client):
    from kubernetes import client as k8s_client

    _, manifests = world(2, {})
    # Pods that run until they are ended.
    for m in manifests:
        if m["kind"] == "Job":
            m["spec"]["template"]["spec"]["containers"][0]["command"] = ["sleep", "300"]
    apply(client, manifests)
    deadline = time.monotonic() + 30
    while len(list(k8s.processes())) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(list(k8s.processes())) == 2
    batch = k8s_client.BatchV1Api(client)
    batch.delete_namespaced_job("w", "default", propagation_policy="Foreground")
    assert not list(k8s.processes())
    assert k8s.api.list("Pod", "default") == []
    assert [s["metadata"]["name"] for s in k8s.api.list("Secret", "default")] == ["w-credentials"]


def test_the_api_refuses_a_client_without_the_token(k8s, tmp_path):
    kubernetes = pytest.importorskip("kubernetes")
    conf = k8s.api.kubeconfig(tmp_path / "kubeconfig")
    data = json.loads(conf.read_text())
    data["users"][0]["user"]["token"] = "wrong"
    conf.write_text(json.dumps(data))
    api = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(str(conf)))
    with pytest.raises(kubernetes.client.exceptions.ApiException) as e:
        api.list_namespaced_pod("default")
    assert e.value.status == 401


@pytest.mark.parametrize(
    "job_index,completion,expected", [(0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)]
)
def test_multi_job_wrapper_computes_process_id(job_index, completion, expected):
    import subprocess

    opts = {"image": "i", "kind": "jobset", "replicas": 2}
    [_, js] = world_manifests("w", 4, ["sh", "-c", "echo $JAXSYS_PROCESS_ID"], opts)
    ctr = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    env = {"JAXSYS_JOB_INDEX": str(job_index), "JOB_COMPLETION_INDEX": str(completion)}
    out = subprocess.run(ctr["command"], env=env, capture_output=True, text=True, timeout=10)
    assert out.stdout.strip() == str(expected)


def test_a_job_without_its_subdomain_gets_jaxs_own_fix(k8s, client):
    """JAX lists the Services to name the fix; the test API answers as a cluster would."""
    _, manifests = world(1, {})
    for m in manifests:
        if m["kind"] == "Job":
            del m["spec"]["template"]["spec"]["subdomain"]
    apply(client, manifests)
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        [pod] = k8s.api.list("Pod", "default")
        if pod["status"]["phase"] == "Failed":
            break
        time.sleep(0.2)
    log = next(iter(k8s.pods.values())).read_log()
    assert pod["status"]["phase"] == "Failed", log
    assert "A headless service 'w' is found that targets this job" in log
    assert "subdomain: w" in log
    job = k8s.api.get("Job", "default", "w")
    assert job["status"]["conditions"][0]["reason"] == "BackoffLimitExceeded"


def test_a_pod_the_kubelet_cannot_start_fails_saying_why(k8s, client):
    _, manifests = world(1, {})
    for m in manifests:
        if m["kind"] == "Job":
            ctr = m["spec"]["template"]["spec"]["containers"][0]
            ctr["volumeMounts"][0]["mountPath"] = "/opt/creds"
    apply(client, manifests)
    deadline = time.monotonic() + 30
    pods = []
    while time.monotonic() < deadline:
        pods = k8s.api.list("Pod", "default")
        if pods and pods[0]["status"]["phase"] == "Failed":
            break
        time.sleep(0.1)
    [pod] = pods
    assert pod["status"]["phase"] == "Failed"
    assert "mounts Secret volumes under /run" in pod["status"]["message"]
    assert not list(k8s.processes())
