"""A Kubernetes cluster driven from a real jaxsys kernel: ``%jaxsys start --launcher
kubernetes`` against the hermetic test cluster (tests/k8s_api.py, tests/k8s_kubelet.py).

The kernel keeps its controller; each pod of the world's Indexed Job runs one engine, which
finds the controller, its CurveZMQ keys and its mTLS certificate in the world's Secret (the
pods share nothing else with the kernel). Process i is pod i; the hang doctor's stacks come
back from the pods; a deleted pod is named as the cause of its process's death; a world
restart makes a new Job; stop leaves no pod, Job, Secret, Service or process (and a killed
kernel neither, after the pods' wait and the world's TTL: tests/live/test_kubernetes_lifetime.py).
"""

from __future__ import annotations

import re
import time

import pytest

from ..certs import CERT_CELL, assert_one_certificate_per_process
from ..harness import Kernel, status_table, tagged_processes
from ..k8s_kubelet import running

pytestmark = [pytest.mark.live, pytest.mark.timeout(240)]

START = (
    "%jaxsys start --launcher kubernetes --devices-per-host 2 --image unused "
    "--controller-ip 127.0.0.1 --env JAX_PLATFORMS=cpu"
)
WHERE_CELL = (
    "%%multihost\nimport socket, jax\n"
    "print(jax.process_index(), 'on', socket.gethostname(), jax.device_count())"
)
NANNY_CELL = (
    "%%multihost\nimport os\nfrom jaxsys_kernel import _compat\n"
    "nanny = _compat.nanny_pid()\n"
    "parent = open(f'/proc/{nanny}/stat').read().rsplit(')', 1)[1].split()[1]\n"
    "fresh = b'ipyparallel.engine.nanny' in open(f'/proc/{nanny}/cmdline', 'rb').read()\n"
    "print('nanny forked:', parent == str(os.getpid()) and not fresh)"
)
KINDS = ("Pod", "Job", "Secret", "Service")
# Seconds from a stop (or from the TTL's end) to nothing left.
DRAIN_S = 20.0


@pytest.fixture
def k8s():
    with running() as cluster:
        yield cluster


def _kernel(k8s, tag, **env) -> Kernel:
    conf = k8s.api.kubeconfig(k8s.dir / "kubeconfig")
    return Kernel(tag, extra_env={"KUBECONFIG": str(conf), **env})


def _start(k: Kernel, k8s, extra: str = "", pods: int = 2) -> str:
    out = k.execute(f"{START} --hosts {pods} {extra}", timeout=180)
    logs = {n: p.read_log()[-1500:] for n, p in k8s.pods.items()}
    assert out.status == "ok", f"start failed: {out.error}\n{out.stderr}\n{logs}"
    [job] = k8s.api.list("Job", "default")
    return job["metadata"]["name"]


def _objects(k8s) -> dict[str, list[str]]:
    found = {kind: [o["metadata"]["name"] for o in k8s.api.list(kind)] for kind in KINDS}
    return {kind: names for kind, names in found.items() if names}


def _nothing_left(k8s, tag: str, kernel_pid: int | None, within: float) -> float:
    """Seconds until no object of a world and no tagged process but the kernel is left."""
    t0 = time.monotonic()

    def left():
        procs = [p.pid for p in tagged_processes(tag) if p.pid != kernel_pid]
        return _objects(k8s), procs, list(k8s.processes())

    while any(left()) and time.monotonic() - t0 < within:
        time.sleep(0.1)
    assert not any(left()), f"left behind: {left()}"
    return time.monotonic() - t0


def _standby_ready(k, n: int, within: float = 60.0) -> str:
    """``%jaxsys status`` once the standby has ``n`` processes ready (bounded wait)."""
    deadline = time.monotonic() + within
    while True:
        status = k.ok("%jaxsys status").stdout
        if f"standby: {n} of {n} processes ready for a restart" in status:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.2)


def notebook_pod(k8s, name: str) -> dict:
    """A pod for a kernel to run "in" (``POD_NAME``): the test kubelet does not run it,
    as it is already Running."""
    return k8s.api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": []},
            "status": {"phase": "Running", "podIP": "127.0.0.254"},
        }
    )


def test_a_kubernetes_cluster_from_the_kernel(k8s, tag):
    k = _kernel(k8s, tag)
    try:
        job = _start(k, k8s, pods=4)
        # Process i is pod i (the Job's completion index), with the devices asked for.
        out = k.ok(WHERE_CELL)
        assert out.stdout == "".join(f"[p{i}] {i} on {job}-{i} 8\n" for i in range(4))
        # Each engine's nanny (which relays signals to it) was forked from the engine,
        # not started as a new interpreter.
        assert k.ok(NANNY_CELL).stdout == "[p0-3] nanny forked: True\n"
        status = k.ok("%jaxsys status").stdout
        assert re.search(r"^security: .*mTLS", status, re.M), status
        assert_one_certificate_per_process(k.ok("%%multihost" + CERT_CELL).stdout, 4)
        # The engines' credentials came in the world's Secret, not in the pod spec.
        [secret] = k8s.api.list("Secret", "default")
        assert secret["metadata"]["ownerReferences"][0]["name"] == job
        assert {"ipcontroller-engine.json", "process-3.key"} <= set(secret["data"])
        spec = str(k8s.api.get("Job", "default", job)["spec"])
        assert "BEGIN" not in spec and "curve" not in spec.lower()
        # The hang doctor: stacks come back from the pods over telemetry.
        out = k.execute("%%multihost --timeout 1.5\nimport time\ntime.sleep(30)", timeout=60)
        assert out.status == "error" and out.error["ename"] == "MultihostTimeout", out.error
        assert ">> " in out.stderr and "time.sleep(30)" in out.stderr, out.stderr
        # The timeout's interrupt reached the engines through their nannies.
        assert k.ok("%%multihost\nprint('back')", timeout=20).stdout == "[p0-3] back\n"
        k.ok("%jaxsys stop")
        assert _nothing_left(k8s, tag, k.pid, DRAIN_S) < DRAIN_S
    finally:
        k.shutdown()


def test_a_deleted_pod_is_named_and_a_restart_makes_a_new_world(k8s, tag):
    k = _kernel(k8s, tag)
    try:
        first = _start(k, k8s)
        [pod1] = [
            p for p in k8s.api.list("Pod", "default") if p["spec"]["hostname"] == f"{first}-1"
        ]
        k8s.api.delete("Pod", "default", pod1["metadata"]["name"])
        deadline = time.monotonic() + 30
        while True:
            rows = status_table(status := k.ok("%jaxsys status").stdout)
            if rows[1]["state"] == "dead" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert rows[1]["state"] == "dead", status
        out = k.execute("%%multihost\nprint('hello')", timeout=60)
        assert "pod" in out.stderr + str(out.error), (out.stderr, out.error)
        out = k.ok("%jaxsys restart", timeout=180)
        # The pod of process 1 is gone: the restart cannot run in the living pods.
        assert f"Kubernetes world {first}: " in out.progress, out.progress
        assert "; its pods are made anew" in out.progress, out.progress
        [job] = k8s.api.list("Job", "default")
        second = job["metadata"]["name"]
        assert second != first
        out = k.ok(WHERE_CELL)
        assert out.stdout == "".join(f"[p{i}] {i} on {second}-{i} 4\n" for i in range(2))
        k.ok("%jaxsys stop")
        _nothing_left(k8s, tag, k.pid, DRAIN_S)
    finally:
        k.shutdown()
