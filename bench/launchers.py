"""Ready time of a 3-process cluster per launcher, and time from stop to nothing left.

What is measured
----------------
For each launcher, in one run and alternating between them round by round:

*ready*: wall time of ``Cluster(hosts=3, devices_per_host=1, launcher=..., standby=0)
.start_sync()`` (for Slurm: from ``sbatch`` until JAX is initialised on the three
processes).

*stop*: wall time from ``cluster.kill()`` until nothing the cluster started is left: every
launcher and engine pid of this machine is gone, and on namespace hosts no engine (nor
Open MPI daemon) is left; for ``slurm`` ``squeue`` is empty too.

Launchers: ``local`` (this machine); ``ssh`` on three network-namespace hosts that each run
an sshd (tests/netns.py, tests/sshd.py); ``mpi``: Open MPI with a hostfile naming those
same hosts, its daemons started over ssh (needs ``mpiexec`` and ``mpi4py``); ``slurm`` on a
private Slurm with one slurmd in each of three namespace hosts (tests/slurm.py; needs
slurm-wlm and munge); ``kubernetes`` on the test cluster (tests/k8s_api.py,
tests/k8s_kubelet.py: an API server on loopback and a kubelet running each pod as a
process; needs unshare and the kubernetes package), where *stop* lasts until no pod, Job,
Secret or Service and no pod process is left. Namespace hosts need root. A launcher that cannot run here is
reported and skipped. The load average is printed before and after, and ratios are
against ``local``.

*restart* (``--restart``, Kubernetes only): wall time of ``cluster.restart_sync()`` of a
2-pod world (1 device each) on the test cluster, three ways measured in turn on one
cluster: from the standby engine booted in each pod (``--standby``), in place without it
(the next world's engines started in the living pods), and recreating the pods (the path a
restart takes when a pod is gone, forced here by having the world's pods refuse reuse).
Every restart starts with each pod's standby booted and is followed by a cell that checks
the new world (process count and a sum across processes). The ratios of the medians to
recreating the pods, and the load average, are printed.

Usage
-----
``python bench/launchers.py [--rounds N]`` (default 2);
``python bench/launchers.py --restart [--rounds N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jaxsys_kernel import Cluster  # noqa: E402
from jaxsys_kernel.cluster.teardown import launcher_pids  # noqa: E402


def _local_pids(c: Cluster) -> list[int]:
    pids = {p.pid for p in c.processes if p.pid} if c._launcher.engine_pids_here else set()
    for r in c.ranks:
        es = c._launcher.engine_set(r)
        if es is not None and c._launcher.launcher_pids_here:
            pids.update(launcher_pids(es))
    return sorted(pids)


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def _engines_in(namespaces: list[str]) -> list[int]:
    """Live engines, nannies and Open MPI daemons inside the namespace hosts."""
    from tests import netns

    found = []
    for ns in namespaces:
        for pid in netns.namespace_pids(ns):
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                cmd = " ".join(p.cmdline())
                if p.status() != psutil.STATUS_ZOMBIE and ("ipyparallel" in cmd or "orted" in cmd):
                    found.append(pid)
    return found


def _wait(done, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not done within {timeout:g} s")
        time.sleep(0.02)


class Kind:
    """One launcher as benchmarked: its cluster's settings, and what \"nothing left\"
    means for it."""

    def __init__(self, name: str, launcher: str, left: Callable[[], bool], **kwargs):
        self.name, self.launcher, self.left, self.kwargs = name, launcher, left, kwargs

    def one(self) -> tuple[float, float]:
        """``(ready, stop)`` seconds for one cluster."""
        settings = {"hosts": 3, "devices_per_host": 1, "standby": 0, **self.kwargs}
        c = Cluster(launcher=self.launcher, env={"JAX_PLATFORMS": "cpu"},
                    progress=lambda e: None, **settings)  # fmt: skip
        t0 = time.perf_counter()
        try:
            c.start_sync()
            ready = time.perf_counter() - t0
            pids = _local_pids(c)
        finally:
            t1 = time.perf_counter()
            c.kill()
        _wait(lambda: _gone(pids) and not self.left())
        return ready, time.perf_counter() - t1


def _kinds(stack: contextlib.ExitStack) -> list[Kind]:
    """Every launcher that can run here, its hosts started in ``stack``."""
    from tests import netns, slurm, sshd

    kinds = [Kind("local", "local", lambda: False)]
    reason = sshd.available()
    if reason:
        print(f"ssh, mpi: skipped ({reason})")
    else:
        hosts = stack.enter_context(netns.TestHosts(3, prefix="bl"))
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        ssh = stack.enter_context(sshd.SSHServers(hosts, work))
        on_hosts = lambda: bool(_engines_in(hosts.namespaces))  # noqa: E731
        kinds.append(
            Kind("ssh", "ssh", on_hosts, hosts=[ssh.destination(i) for i in range(3)],
                 controller_ip=hosts.bridge_address,
                 launcher_options={"ssh_args": ssh.ssh_args, "scp_args": ssh.ssh_args})
        )  # fmt: skip
        if shutil.which("mpiexec") and importlib.util.find_spec("mpi4py"):
            hostfile = work / "hostfile"
            hostfile.write_text("".join(f"{a} slots=1\n" for a in hosts.host_addresses))
            os.environ["OMPI_MCA_plm_rsh_agent"] = shlex.join(["ssh", *ssh.ssh_args])
            kinds.append(
                Kind("mpi", "mpi", on_hosts, controller_ip=hosts.bridge_address,
                     launcher_options={"hostfile": str(hostfile)})
            )  # fmt: skip
        else:
            print("mpi: skipped (needs mpiexec and mpi4py)")
    reason = slurm.available()
    if reason:
        print(f"slurm: skipped ({reason})")
    else:
        s = stack.enter_context(slurm.SlurmHosts(3))
        kinds.append(
            Kind("slurm", "slurm", lambda: bool(s.queue() or s.namespace_pids()),
                 launcher_options={"sbatch_args": ["--ntasks-per-node=1"]})
        )  # fmt: skip
    from tests import k8s_kubelet

    reason = k8s_kubelet.unavailable()
    if reason:
        print(f"kubernetes: skipped ({reason})")
    else:
        k8s = stack.enter_context(contextlib.closing(_TestCluster(k8s_kubelet)))
        conf = k8s.api.kubeconfig(k8s.dir / "kubeconfig")
        # The pods run "python3" from PATH: this interpreter's, as an image's would be.
        os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
        kinds.append(
            Kind("k8s", "kubernetes", k8s.left, controller_ip="127.0.0.1",
                 launcher_options={"image": "unused", "kubeconfig": str(conf)})
        )  # fmt: skip
    return kinds


class _TestCluster:
    """The test cluster, with what \"nothing left\" means on it."""

    def __init__(self, k8s_kubelet):
        self.cluster = k8s_kubelet.TestCluster()
        self.api, self.dir = self.cluster.api, self.cluster.dir

    def left(self) -> bool:
        kinds = ("Pod", "Job", "Secret", "Service")
        return any(self.api.list(k) for k in kinds) or any(self.cluster.processes())

    def close(self) -> None:
        self.cluster.stop()


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# Run in each process of a restarted world: its process count, and a sum across processes.
_WORLD_CHECK = """
import jax, jax.numpy as jnp
from jax.experimental import multihost_utils as mu
_world = (jax.process_count(), float(mu.process_allgather(jnp.float32(jax.process_index() + 1)).sum()))
"""


def _check_world(c: Cluster) -> None:
    """Every process of the new world sees both, and a sum across processes works."""
    c.view.execute(_WORLD_CHECK, block=True)
    got = c.view.pull("_world", block=True)
    if [tuple(g) for g in got] != [(2, 3.0)] * 2:
        raise RuntimeError(f"the restarted world is not whole: {got}")


async def _nothing_taken(world, ranks, report, wait_s=0.0):
    return {}


def _standby_ready(c: Cluster, timeout: float = 60.0) -> None:
    """Wait until every pod's standby engine has booted (each round starts from there)."""
    _wait(lambda: c.standby_status()["ready"] == c.nprocs, timeout)


def restarts(rounds: int) -> int:
    """World restarts from each pod's standby, in place without it, and recreating the
    pods, side by side on one cluster."""
    from tests import k8s_kubelet

    reason = k8s_kubelet.unavailable()
    if reason:
        print(f"kubernetes: cannot run here ({reason})")
        return 1
    print(f"load average before: {_load()}")
    times: dict[str, list[float]] = {"standby": [], "in place": [], "new pods": []}
    with contextlib.closing(_TestCluster(k8s_kubelet)) as k8s:
        conf = k8s.api.kubeconfig(k8s.dir / "kubeconfig")
        os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
        c = Cluster(launcher="kubernetes", hosts=2, devices_per_host=1, standby=2,
                    controller_ip="127.0.0.1", env={"JAX_PLATFORMS": "cpu"},
                    launcher_options={"image": "unused", "kubeconfig": str(conf)},
                    progress=lambda e: None)  # fmt: skip
        try:
            c.start_sync()
            worlds, standby = c._launcher.worlds, c.world.standby
            end_engines, take = worlds.end_engines, standby.take
            for _ in range(rounds + 1):  # the first round warms up
                for how in times:
                    _standby_ready(c)
                    # Recreating: the pods refuse reuse, as when one is gone.
                    worlds.end_engines = (
                        end_engines if how != "new pods" else lambda: "the bench asks for new pods"
                    )
                    standby.take = take if how == "standby" else _nothing_taken
                    standby.last_taken = 0
                    t0 = time.perf_counter()
                    c.restart_sync()
                    times[how].append(time.perf_counter() - t0)
                    _check_world(c)
                    if (c.standby_status()["taken"] == c.nprocs) != (how == "standby"):
                        raise RuntimeError(
                            f"the {how} restart did not take the path it names: "
                            f"{c.standby_status()} after {times}"
                        )
        finally:
            c.kill()
        _wait(lambda: not k8s.left())
    print(f"{'restart':<9} {'median s':>9}  each (after a warm-up round)")
    for how, each in times.items():
        rest = each[1:]
        print(f"{how:<9} {statistics.median(rest):9.2f}  {' '.join(f'{t:.2f}' for t in rest)}")
    new = statistics.median(times["new pods"][1:])
    for how in ("standby", "in place"):
        print(f"new pods / {how}: {new / statistics.median(times[how][1:]):.2f}x")
    print(f"load average after: {_load()}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--restart", action="store_true", help="Kubernetes: in-place restarts")
    args = ap.parse_args()
    if args.restart:
        return restarts(args.rounds)
    print(f"load average before: {_load()}")
    with contextlib.ExitStack() as stack:
        kinds = _kinds(stack)
        results: dict[str, list[tuple[float, float]]] = {k.name: [] for k in kinds}
        for k in kinds:  # warm-up: imports, page cache, Slurm's first job
            k.one()
        for _ in range(args.rounds):
            for k in kinds:
                results[k.name].append(k.one())
    base = statistics.median(r for r, _ in results["local"])
    print(f"{'launcher':<8} {'ready s':>8} {'x local':>8} {'stop->nothing left s':>21}")
    for name, rows in results.items():
        ready = statistics.median(r for r, _ in rows)
        stop = statistics.median(s for _, s in rows)
        print(f"{name:<8} {ready:8.2f} {ready / base:8.2f} {stop:21.2f}")
    print(f"load average after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
