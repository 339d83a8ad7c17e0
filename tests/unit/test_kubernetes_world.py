"""What a notebook's world on Kubernetes hands its pods, checked without a cluster: the
environment as pods see it, the Secret's files and the words for a pod that waits or
ended. The engine command runs in tests/live/test_kubernetes_engine_command.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from jaxsys_kernel.cluster import security
from jaxsys_kernel.cluster.launchers import kubernetes_api
from jaxsys_kernel.cluster.launchers.kubernetes import CREDENTIALS_DIR
from jaxsys_kernel.cluster.launchers.kubernetes_world import credential_files, pod_env

pytestmark = pytest.mark.unit


@pytest.fixture
def pki(tmp_path):
    return security.make_pki(tmp_path, "c1", 2, None)


def test_every_certificate_and_key_goes_into_the_secret(pki):
    files = credential_files(pki)
    assert {"process-0.pem", "process-0.key", "process-1.pem", "process-1.key"} <= set(files)
    assert all(p.exists() for p in files.values())
    assert len(files) == 5  # and the CA's certificate


def test_pods_see_certificate_paths_in_the_secret_and_no_kernel_file(pki, tmp_path):
    env = {
        **pki.env_by_rank(),
        "JAX_PLATFORMS": "cpu",
        "JAXSYS_STACK_FILE": f"{tmp_path}/log/stacks-0.txt",
        "JAX_COMPILATION_CACHE_DIR": "/shared/cache",
    }
    seen = pod_env(env, pki, tmp_path)
    assert seen["JAX_MTLS_CA_FILE"] == f"{CREDENTIALS_DIR}/{Path(pki.ca_file).name}"
    templates = [v for k, v in seen.items() if "TEMPLATE" in k]
    assert templates and all(v.startswith(f"{CREDENTIALS_DIR}/process-") for v in templates)
    assert "JAXSYS_STACK_FILE" not in seen
    assert seen["JAX_PLATFORMS"] == "cpu"
    assert seen["JAX_COMPILATION_CACHE_DIR"] == "/shared/cache"


def _pod(phase, conditions=(), statuses=(), message=None):
    return SimpleNamespace(
        metadata=SimpleNamespace(name="w-0", labels={}),
        status=SimpleNamespace(
            phase=phase,
            message=message,
            conditions=list(conditions),
            container_statuses=list(statuses),
        ),
    )


def test_a_waiting_pod_says_what_the_cluster_says():
    unschedulable = SimpleNamespace(
        type="PodScheduled",
        status="False",
        reason="Unschedulable",
        message="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    )
    assert kubernetes_api.why_pending(_pod("Pending", [unschedulable])) == (
        "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    )
    pulling = SimpleNamespace(
        state=SimpleNamespace(
            waiting=SimpleNamespace(reason="ImagePullBackOff", message=None), terminated=None
        )
    )
    assert kubernetes_api.why_pending(_pod("Pending", statuses=[pulling])) == "ImagePullBackOff"
    assert kubernetes_api.why_pending(_pod("Pending")) is None


def test_an_ended_pod_gives_its_reason_and_exit_code():
    killed = SimpleNamespace(
        state=SimpleNamespace(
            waiting=None, terminated=SimpleNamespace(reason="OOMKilled", exit_code=137)
        )
    )
    assert kubernetes_api.why_ended(_pod("Failed", statuses=[killed])) == (
        "Failed; OOMKilled, exit code 137"
    )


def test_the_kernels_pod_is_found_from_the_downward_api_or_its_hostname(monkeypatch, tmp_path):
    for var in ("POD_NAME", "POD_NAMESPACE", "KUBERNETES_SERVICE_HOST", "HOSTNAME"):
        monkeypatch.delenv(var, raising=False)
    # Outside a pod: no owner, and nothing to say.
    assert kubernetes_api.own_pod_name() is None
    assert kubernetes_api.own_pod_owner(None, "default") == (None, "")
    monkeypatch.setenv("POD_NAME", "notebook-0")
    monkeypatch.setenv("POD_NAMESPACE", "ml")
    assert kubernetes_api.own_pod_name() == ("notebook-0", "ml")
    # An owner must share its objects' namespace: said, and no reference made.
    ref, note = kubernetes_api.own_pod_owner(None, "default")
    assert ref is None and "namespace ml" in note and "default" in note, note
    # In a pod without the downward API: the hostname, and the service account's namespace.
    monkeypatch.delenv("POD_NAME")
    monkeypatch.delenv("POD_NAMESPACE")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("HOSTNAME", "hub-user-1")
    ns_file = tmp_path / "namespace"
    ns_file.write_text("jhub\n")
    monkeypatch.setattr(kubernetes_api, "SERVICE_ACCOUNT_NAMESPACE", str(ns_file))
    assert kubernetes_api.own_pod_name() == ("hub-user-1", "jhub")


def test_the_client_is_imported_ahead_only_where_a_cluster_is_configured():
    import sys

    # Nothing names a cluster: no thread, nothing imported (a local user pays nothing).
    assert kubernetes_api.warm_up({}) is None
    assert kubernetes_api.warm_up({"KUBECONFIG": ""}) is None
    # A kubeconfig, or a pod's service: the API classes a start needs are loaded.
    for env in ({"KUBECONFIG": "/nonexistent"}, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}):
        thread = kubernetes_api.warm_up(env)
        assert thread is not None
        thread.join(60)
        assert not thread.is_alive()
    assert "kubernetes.client.api.batch_v1_api" in sys.modules
