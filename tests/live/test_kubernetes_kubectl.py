"""``kubectl`` against the hermetic test cluster, for the commands docs/clusters.md shows:
apply a world's manifests, list its pods by label, read a pod's log, delete the world."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from jaxsys_kernel.cluster.launchers.kubernetes import WORLD_LABEL, dump, world_manifests
from tests.k8s_kubelet import TestCluster, unavailable

pytestmark = [pytest.mark.live, pytest.mark.timeout(120)]


@pytest.fixture
def kubectl(tmp_path):
    why = unavailable() or (None if shutil.which("kubectl") else "kubectl is not installed")
    if why:
        pytest.skip(why)
    cluster = TestCluster()
    env = {
        # The user's own rights (an administrator's here), not the kernel's Role.
        "KUBECONFIG": str(cluster.api.kubeconfig(tmp_path / "kubeconfig", token=cluster.api.token)),
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
    }

    def run(*args: str) -> str:
        proc = subprocess.run(
            ["kubectl", *args], env=env, capture_output=True, text=True, timeout=30
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    run.cluster = cluster
    try:
        yield run
    finally:
        cluster.stop()
    assert not list(cluster.processes())


def test_kubectl_applies_lists_reads_and_deletes_a_world(kubectl, tmp_path):
    cluster = kubectl.cluster
    command = ["sh", "-c", "echo process $JOB_COMPLETION_INDEX of $HOSTNAME; exec sleep 300"]
    manifest = tmp_path / "world.yaml"
    manifest.write_text(dump(world_manifests("w", 2, command, {"image": "i"})))
    # The test API serves no OpenAPI documents; the schemas are checked offline instead
    # (tests/unit/test_kubernetes_manifests.py).
    out = kubectl("apply", "--validate=false", "-f", str(manifest))
    assert out.split() == [
        "secret/w-credentials",
        "created",
        "service/w",
        "created",
        "job.batch/w",
        "created",
    ]
    rows = kubectl("get", "pods", "-l", f"{WORLD_LABEL}=w", "-o", "name").split()
    assert len(rows) == 2 and all(r.startswith("pod/w-") for r in rows)
    logs = {}
    deadline = time.monotonic() + 30
    while len(logs) < 2 and time.monotonic() < deadline:
        logs = {r: kubectl("logs", r) for r in rows}
        logs = {r: text for r, text in logs.items() if text}
        time.sleep(0.2)
    assert sorted(logs.values()) == ["process 0 of w-0\n", "process 1 of w-1\n"]
    assert len(list(cluster.processes())) == 2
    kubectl("delete", "-f", str(manifest))
    assert kubectl("get", "pods", "-o", "name") == ""
    assert not list(cluster.processes())
