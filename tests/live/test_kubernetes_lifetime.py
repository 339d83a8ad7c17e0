"""What outlives a Kubernetes cluster's kernel, against the hermetic test cluster: a killed
kernel's world (its engines, each pod's standby engine, the pods, the Job, its Secret and
Service) is gone after the lease's TTL and the world's TTL, and a kernel in a pod takes its
worlds with it when that pod is deleted.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from ..harness import Kernel
from ..k8s_kubelet import running
from .test_kubernetes_kernel import (
    DRAIN_S,
    START,
    _kernel,
    _nothing_left,
    _standby_ready,
    _start,
    notebook_pod,
)

pytestmark = [pytest.mark.live, pytest.mark.timeout(240)]

TTL_S = 1
# Seconds pods wait for a kernel once their engines ended (the lease's TTL).
LEASE_S = 3
# Heartbeats the pods' engines may miss before they leave (4: about 3 s, not 15).
MISSES = 4


@pytest.fixture
def k8s():
    with running() as cluster:
        yield cluster


def test_a_killed_kernels_world_is_gone_after_its_ttl(k8s, tag):
    k = _kernel(k8s, tag, JAXSYS_LEASE_TTL=str(LEASE_S), JAXSYS_ENGINE_HEARTBEAT_MISSES=str(MISSES))
    try:
        # With each pod's standby engine booted: it, too, leaves with the heartbeats.
        _start(k, k8s, f"--ttl-after-finished {TTL_S} --standby 2")
        assert len(list(k8s.processes())) == 2
        _standby_ready(k, 2)
        os.kill(k.pid, signal.SIGKILL)
        t0 = time.monotonic()
        # The engines miss the controller's heartbeats and end; the pods wait the lease's
        # TTL for a kernel and end; the Job finishes; the TTL controller deletes it, and
        # the garbage collector its Secret and Service.
        within = MISSES * 0.75 + LEASE_S + TTL_S + DRAIN_S
        took = _nothing_left(k8s, tag, None, within)
        print(f"kernel SIGKILL to nothing left: {time.monotonic() - t0:.1f} s (TTL {TTL_S} s)")
        assert took < within
    finally:
        k.shutdown()


def test_a_kernel_pods_worlds_are_its_own_and_go_when_it_is_deleted(k8s, tag):
    kernel_pod = notebook_pod(k8s, "notebook-0")
    conf = k8s.api.kubeconfig(k8s.dir / "kubeconfig")
    env = {"KUBECONFIG": str(conf), "POD_NAME": "notebook-0", "POD_NAMESPACE": "default"}
    k = Kernel(tag, extra_env=env)
    try:
        out = k.execute(f"{START} --hosts 2 --ttl-after-finished 600", timeout=180)
        assert out.status == "ok", (out.error, out.stderr)
        assert "owned by the kernel's pod notebook-0" in out.progress, out.progress
        [job] = k8s.api.list("Job", "default")
        [owner] = job["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("Pod", kernel_pod["metadata"]["uid"])
        # Deleting the kernel's pod deletes its world at once (the TTL is 10 minutes), as
        # the cluster's garbage collector does; then the kubelet ends the kernel.
        k8s.api.delete("Pod", "default", "notebook-0")
        os.kill(k.pid, signal.SIGKILL)
        assert _nothing_left(k8s, tag, None, DRAIN_S) < DRAIN_S
    finally:
        k.shutdown()
