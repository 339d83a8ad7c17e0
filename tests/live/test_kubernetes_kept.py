"""A Kubernetes world kept past its kernel, through real kernels against the hermetic test
cluster (tests/k8s_api.py, tests/k8s_kubelet.py).

``%jaxsys stop --keep-allocation`` keeps the world's pods (their engines end, the Secret
says the world is kept and holds no credentials); the kernel is killed; ``%jaxsys attach``
in a new kernel finds the world and starts its engines in the same pods, with its own
credentials; a plain stop then deletes the world and leaves no pod, Job, Secret, Service
or process.

The kernels run "in" pods of their own (as under JupyterHub): the world belongs to the
kernel's pod while a kernel runs on it, to nobody while it is kept (deleting the first
kernel's pod leaves it), and to the attaching kernel's pod after the attach.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from ..harness import Kernel
from ..k8s_kubelet import running
from .test_kubernetes_kernel import DRAIN_S, _nothing_left, notebook_pod

pytestmark = [pytest.mark.live, pytest.mark.timeout(120)]

START = (
    "%jaxsys start --launcher kubernetes --hosts 2 --devices-per-host 1 --image unused "
    "--controller-ip 127.0.0.1 --env JAX_PLATFORMS=cpu"
)
WHERE_CELL = (
    "%%multihost\nimport socket, jax\nprint(jax.process_index(), 'on', socket.gethostname())"
)
# Seconds the kept pods wait for an attach (the lease's TTL): room for a kernel to start.
TTL_S = 30


@pytest.fixture
def k8s():
    with running() as cluster:
        yield cluster


def _pods(k8s) -> dict[str, str]:
    """The world's pods (not the kernels'), by uid."""
    pods = k8s.api.list("Pod", "default")
    return {
        p["metadata"]["uid"]: p["metadata"]["name"]
        for p in pods
        if not p["metadata"]["name"].startswith("notebook-")
    }


def _wait(what: str, test, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (got := test()):
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.1)
    return got


def _owners(k8s, world: str) -> list[str]:
    job = k8s.api.get("Job", "default", world)
    return [r["uid"] for r in job["metadata"].get("ownerReferences") or []]


def test_a_kept_world_is_attached_to_from_a_new_kernel_on_the_same_pods(k8s, tag, tmp_path):
    conf = k8s.api.kubeconfig(tmp_path / "kubeconfig")
    env = {
        "KUBECONFIG": str(conf),
        "JAXSYS_STATE_DIR": str(tmp_path / "state"),
        "JAXSYS_LEASE_TTL": str(TTL_S),
        "POD_NAMESPACE": "default",
    }
    first, second = (notebook_pod(k8s, n)["metadata"]["uid"] for n in ("notebook-a", "notebook-b"))
    t0 = time.monotonic()
    a, b = Kernel(tag, extra_env={**env, "POD_NAME": "notebook-a"}), None
    try:
        a.ok(START, timeout=90)
        [job] = k8s.api.list("Job", "default")
        world, pods = job["metadata"]["name"], _pods(k8s)
        assert _owners(k8s, world) == [first]
        assert a.ok(WHERE_CELL).stdout == f"[p0] 0 on {world}-0\n[p1] 1 on {world}-1\n"
        out = a.ok("%jaxsys stop --keep-allocation").stdout
        assert f"Kubernetes world {world} in namespace default is kept" in out, out
        assert f"pods wait {TTL_S} s for %jaxsys attach" in out, out
        secret = k8s.api.get("Secret", "default", f"{world}-credentials")
        assert secret["metadata"]["labels"]["jaxsys.dev/kept"] == "true"
        assert "ipcontroller-engine.json" not in secret["data"]
        # The engines end; the pods stay, waiting.
        _wait("kept pods", lambda: all("kept (" in p.read_log() for p in k8s.pods.values()))
        assert _pods(k8s) == pods and len(list(k8s.processes())) == 2
        # Kept, the world has no owner: the first kernel's pod goes (its server stopped),
        # and the world stays for the next kernel.
        assert _owners(k8s, world) == []
        k8s.api.delete("Pod", "default", "notebook-a")
        os.kill(a.pid, signal.SIGKILL)
        assert _pods(k8s) == pods
        b = Kernel(tag, extra_env={**env, "POD_NAME": "notebook-b"})
        out = b.execute("%jaxsys attach", timeout=90)
        assert out.status == "ok", f"{out.error}\n{out.stderr}"
        assert f"Kubernetes world {world}: new engines in its 2 pods" in out.progress
        assert "owned by the kernel's pod notebook-b" in out.progress, out.progress
        assert _owners(k8s, world) == [second]
        # The same pods, with new engines: process i is still pod i.
        assert b.ok(WHERE_CELL).stdout == f"[p0] 0 on {world}-0\n[p1] 1 on {world}-1\n"
        assert _pods(k8s) == pods
        secret = k8s.api.get("Secret", "default", f"{world}-credentials")
        assert "jaxsys.dev/kept" not in secret["metadata"]["labels"]
        # A plain stop deletes the world, and the attach has nothing left to find.
        b.ok("%jaxsys stop")
        k8s.api.delete("Pod", "default", "notebook-b")  # the only object not the world's
        _nothing_left(k8s, tag, b.pid, DRAIN_S)
        out = b.execute("%jaxsys attach")
        assert out.status == "error" and "no saved job to attach to" in out.error["evalue"]
        out = b.execute(f"%jaxsys attach default/{world}")
        assert out.status == "error", out.stdout
        assert f"Kubernetes world {world} in namespace default is gone" in out.error["evalue"]
        print(f"start, keep, kernel kill, attach, cell, stop: {time.monotonic() - t0:.1f} s")
    finally:
        for k in (a, b):
            if k is not None:
                k.shutdown()
