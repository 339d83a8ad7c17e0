"""``%jaxsys restart`` of a Kubernetes world in its living pods, through a real kernel
against the hermetic test cluster (tests/k8s_api.py, tests/k8s_kubelet.py).

The restart ends each pod's engine (a generation without one) and starts the next
world's in the same pods: the pods keep their uids, the Job is the same, and the next
cell runs on a fresh JAX world (new engine processes, the next incarnation, a working
collective). A stop then leaves no pod, Job, Secret, Service or process. The fallback
(a pod gone: the world is made anew) is tested in tests/live/test_kubernetes_kernel.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ..harness import Kernel
from ..k8s_kubelet import running
from .test_kubernetes_kernel import DRAIN_S, _nothing_left, _standby_ready

pytestmark = [pytest.mark.live, pytest.mark.timeout(120)]

START = (
    "%jaxsys start --launcher kubernetes --hosts 2 --devices-per-host 1 --image unused "
    "--controller-ip 127.0.0.1 --env JAX_PLATFORMS=cpu"
)
# Each process: its index, the process count, its world's incarnation, its engine's pid,
# a sum across processes (1 + 2), and whether the pod's fork server forked the engine.
WORLD_CELL = (
    "%%multihost\nimport os, jax, jax.numpy as jnp\n"
    "from jax.experimental import multihost_utils as mu\n"
    "total = float(mu.process_allgather(jnp.float32(jax.process_index() + 1)).sum())\n"
    "parent = open(f'/proc/{os.getppid()}/cmdline', 'rb').read()\n"
    "print(jax.process_index(), jax.process_count(), os.environ['JAXSYS_INCARNATION'], "
    "os.getpid(), total, 'forked' if b'engine.forkserver' in parent else 'plain')"
)
# Each process starts a child of its own, in its engine's process group; its command line
# carries a mark the test finds it by (a pod's pids are its own namespace's).
CHILD_CELL = "%%multihost\nimport subprocess\nsubprocess.Popen(['sleep', '{mark}'])"


@pytest.fixture
def k8s():
    with running() as cluster:
        yield cluster


def _world(out: str) -> list[list[str]]:
    """Each process's printed fields, in rank order (without the ``[pN]`` prefix)."""
    return [line.split()[1:] for line in out.splitlines()]


def _running(mark: str) -> list[int]:
    """The processes (host pids) whose command line is ``sleep MARK``, zombies left out."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if cmd[:2] == [b"sleep", mark.encode()] and state != "Z":
            found.append(int(proc.name))
    return found


def _ended(mark: str, within: float = 30.0) -> list[int]:
    """The ``sleep MARK`` processes still running after up to ``within`` s. A restart from
    the standby does not wait for the pods: each ends its old engine (and its group) when it
    next reads the Secret, on its own poll; the engine's group goes when a thread of the
    engine's own runs, which on a loaded machine took over 10 s once."""
    deadline = time.monotonic() + within
    while (left := _running(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _pod_uids(k8s) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in k8s.api.list("Pod", "default")}


def _next_world_in_the_same_pods(k, k8s, world: str, pods: dict, before: list) -> list:
    """After a restart: the same pods and Job run new engines, forked by each pod's fork
    server (nothing imported again), in the next incarnation of a working JAX world; returns
    each process's fields."""
    assert _pod_uids(k8s) == pods
    assert [j["metadata"]["name"] for j in k8s.api.list("Job", "default")] == [world]
    after = _world(k.ok(WORLD_CELL).stdout)
    incarnation = str(int(before[0][2]) + 1)
    assert [(f[0], f[1], f[2], f[4], f[5]) for f in after] == [
        (str(i), "2", incarnation, "3.0", "forked") for i in range(2)
    ]
    assert {f[3] for f in before}.isdisjoint(f[3] for f in after)
    return after


def test_a_restart_runs_the_next_world_in_the_same_pods(k8s, tag):
    conf = k8s.api.kubeconfig(k8s.dir / "kubeconfig")
    k = Kernel(tag, extra_env={"KUBECONFIG": str(conf)})
    try:
        t0 = time.monotonic()
        # Without a standby, the next world's engines start in the pods (a new generation).
        out = k.execute(f"{START} --standby 0", timeout=90)
        assert out.status == "ok", f"{out.error}\n{out.stderr}"
        [job] = k8s.api.list("Job", "default")
        world, pods = job["metadata"]["name"], _pod_uids(k8s)
        first = _world(k.ok(WORLD_CELL).stdout)
        assert [(f[0], f[1], f[2], f[4]) for f in first] == [
            (str(i), "2", "1", "3.0") for i in range(2)
        ]
        mark = f"600.{k.pid}"
        k.ok(CHILD_CELL.format(mark=mark))
        assert len(_running(mark)) == 2
        t1 = time.monotonic()
        out = k.ok("%jaxsys restart", timeout=60)
        took = time.monotonic() - t1
        assert f"Kubernetes world {world}: a new world in its 2 living pods" in out.progress
        _next_world_in_the_same_pods(k, k8s, world, pods, first)
        # What the old engines' cells started ended with them.
        assert _ended(mark) == []
        k.ok("%jaxsys stop")
        _nothing_left(k8s, tag, k.pid, DRAIN_S)
        print(f"start, cell, restart ({took:.1f} s), cell, stop: {time.monotonic() - t0:.1f} s")
    finally:
        k.shutdown()


def test_a_restart_takes_over_the_standby_engine_booted_in_each_pod(k8s, tag):
    conf = k8s.api.kubeconfig(k8s.dir / "kubeconfig")
    k = Kernel(tag, extra_env={"KUBECONFIG": str(conf)})
    try:
        # The default for users (the suite sets $JAXSYS_STANDBY=0 for every cluster).
        out = k.execute(f"{START} --standby 2", timeout=90)
        assert out.status == "ok", f"{out.error}\n{out.stderr}"
        [job] = k8s.api.list("Job", "default")
        world, pods = job["metadata"]["name"], _pod_uids(k8s)
        _standby_ready(k, 2)
        first = _world(k.ok(WORLD_CELL).stdout)
        k.ok(CHILD_CELL.format(mark=(mark1 := f"601.{k.pid}")))
        out = k.ok("%jaxsys restart", timeout=60)
        # Every process came from its pod's standby: no generation started an engine.
        assert "(2 from the standby)" in out.stdout, out.stdout
        assert "living pods" not in out.progress, out.progress
        second = _next_world_in_the_same_pods(k, k8s, world, pods, first)
        assert _ended(mark1) == []
        # The pods boot the next standby; the engines that took over serve until the next
        # restart, which ends them (and what their cells started) in turn.
        k.ok(CHILD_CELL.format(mark=(mark2 := f"602.{k.pid}")))
        assert len(_running(mark2)) == 2
        _standby_ready(k, 2)
        out = k.ok("%jaxsys restart", timeout=60)
        assert "(2 from the standby)" in out.stdout, out.stdout
        _next_world_in_the_same_pods(k, k8s, world, pods, second)
        assert _ended(mark2) == []
        k.ok("%jaxsys stop")
        _nothing_left(k8s, tag, k.pid, DRAIN_S)
    finally:
        k.shutdown()
