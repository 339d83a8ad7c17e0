"""Ready time of a 3-process cluster per launcher, and time from stop to nothing left.

What is measured
----------------
For each launcher, in one run and alternating between them round by round:

*ready*: wall time of ``Cluster(hosts=3, devices_per_host=1, launcher=...).start_sync()``
(for Slurm: from ``sbatch`` until JAX is initialised on the three processes).

*stop*: wall time from ``cluster.kill()`` until nothing the cluster started is left: for
``local`` and ``mpi`` every launcher and engine pid of this machine is gone; for ``slurm``
``squeue`` is empty and no process of the job is left on the namespace hosts.

Launchers: ``local``; ``mpi`` (Open MPI, when ``mpiexec`` and ``mpi4py`` are here);
``slurm`` on a private three-host Slurm in network namespaces (tests/slurm.py; root,
slurm-wlm and munge needed). A launcher that cannot run here is reported and skipped.
The load average is printed before and after, and ratios are against ``local``.

Usage
-----
``python bench/launchers.py [--rounds N]`` (default 2).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jaxsys_kernel import Cluster  # noqa: E402
from jaxsys_kernel.cluster.teardown import launcher_pids  # noqa: E402


def _local_pids(c: Cluster) -> list[int]:
    pids = {p.pid for p in c.processes if p.pid}
    for r in c.ranks:
        es = c._launcher.engine_set(r)
        if es is not None:
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


def _wait(done, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not done within {timeout:g} s")
        time.sleep(0.02)


def one(launcher: str, slurm_hosts=None) -> tuple[float, float]:
    """``(ready, stop)`` seconds for one cluster of this launcher."""
    opts = {"sbatch_args": ["--ntasks-per-node=1"]} if launcher == "slurm" else None
    c = Cluster(
        hosts=3,
        devices_per_host=1,
        launcher=launcher,
        env={"JAX_PLATFORMS": "cpu"},
        launcher_options=opts,
        progress=lambda e: None,
    )
    t0 = time.perf_counter()
    try:
        c.start_sync()
        ready = time.perf_counter() - t0
        pids = _local_pids(c) if slurm_hosts is None else []
    finally:
        t1 = time.perf_counter()
        c.kill()
    if slurm_hosts is not None:
        _wait(lambda: not slurm_hosts.queue() and not slurm_hosts.namespace_pids())
    else:
        _wait(lambda: _gone(pids))
    return ready, time.perf_counter() - t1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    kinds = ["local"]
    if shutil.which("mpiexec") and importlib.util.find_spec("mpi4py"):
        kinds.append("mpi")
    else:
        print("mpi: skipped (needs mpiexec and mpi4py)")
    from tests import slurm

    reason = slurm.available()
    hosts = None
    if reason:
        print(f"slurm: skipped ({reason})")
    else:
        hosts = slurm.SlurmHosts(3).__enter__()
        kinds.append("slurm")
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    try:
        for k in kinds:  # warm-up: imports, page cache, Slurm's first job
            one(k, hosts if k == "slurm" else None)
        for _ in range(args.rounds):
            for k in kinds:
                results[k].append(one(k, hosts if k == "slurm" else None))
    finally:
        if hosts is not None:
            hosts.close()
    base = statistics.median(r for r, _ in results["local"])
    print(f"{'launcher':<8} {'ready s':>8} {'x local':>8} {'stop->empty s':>14}")
    for k, rows in results.items():
        ready = statistics.median(r for r, _ in rows)
        stop = statistics.median(s for _, s in rows)
        print(f"{k:<8} {ready:8.2f} {ready / base:8.2f} {stop:14.2f}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
