"""The Roles docs/clusters.md gives, and the test API's check of them: the Kubernetes tests
run the kernel and the pods with exactly those rights (tests/k8s_kubelet.py), so these
check that the check itself holds: a documented right is served, anything else is refused
with 403, through the real Kubernetes client over TLS."""

from __future__ import annotations

import json

import pytest

from jaxsys_kernel.cluster.launchers import kubernetes_api
from tests.k8s_api import ApiServer
from tests.k8s_rbac import ENGINE_ROLE, KERNEL_ROLE, allows, documented_roles

pytestmark = pytest.mark.unit


def test_the_page_gives_the_kernels_and_the_pods_roles():
    roles = documented_roles()
    assert {KERNEL_ROLE, ENGINE_ROLE} <= set(roles)
    kernel, engine = roles[KERNEL_ROLE], roles[ENGINE_ROLE]
    # What a kept world's attach and a restart write, and JAX's detection reads.
    assert allows(kernel, "update", "", "secrets")
    assert allows(kernel, "patch", "batch", "jobs")
    assert allows(kernel, "get", "", "pods/log")
    assert allows(engine, "watch", "batch", "jobs")
    assert not allows(engine, "get", "", "secrets")
    assert not allows(kernel, "delete", "", "pods")


@pytest.fixture
def server(tmp_path):
    api = ApiServer(tmp_path).start()
    try:
        yield api
    finally:
        api.stop()


def test_a_token_may_do_what_its_role_allows_and_nothing_else(server, tmp_path):
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    server.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {}})
    pods_only = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    conf = server.kubeconfig(tmp_path / "kubeconfig", token=server.grant(pods_only))
    core = client.CoreV1Api(config.new_client_from_config(str(conf)))
    assert core.list_namespaced_pod("default").items == []
    with pytest.raises(ApiException) as refused:
        core.read_namespaced_secret("s", "default")
    assert refused.value.status == 403
    said = json.loads(refused.value.body)
    assert said["reason"] == "Forbidden", said
    assert 'cannot "get" resource "secrets"' in said["message"], said
    assert server.forbidden == [("get", "", "secrets")]
    # The administrator's token (the tests' own, kubectl's) may do anything.
    admin = server.kubeconfig(tmp_path / "admin", token=server.token)
    secret = kubernetes_api.read_secret(config.new_client_from_config(str(admin)), "default", "s")
    assert secret["metadata"]["name"] == "s"
