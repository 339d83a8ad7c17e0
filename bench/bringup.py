"""Bring-up time of a jaxsys cluster against bare ``jax.distributed`` processes.

What is measured
----------------
*cluster*: wall time of ``Cluster(hosts=4, devices_per_host=2).start_sync()``, from the
call until it returns with JAX initialised on all four processes (ipyparallel controller
started, four engines launched and registered, ranks identified,
``jax.distributed.initialize`` and the device query done on every engine). The time at
which the last engine registered is recorded too, from the cluster's progress events, to
show where the time goes.

*bare*: the least any launcher could do for the same JAX world. Four plain Python
processes are started with ``subprocess``, each with
``XLA_FLAGS=--xla_force_host_platform_device_count=2`` and ``JAX_PLATFORMS=cpu``; each
imports jax, calls ``jax.distributed.initialize`` against a coordinator on a free
127.0.0.1 port (process 0 serves it), calls ``jax.devices()``, prints a ready marker and
exits. The time runs from the first ``Popen`` until all four markers have been read.

The two are alternated (cluster, bare, cluster, bare, ...) after one untimed warm-up of
each, so that a cold page cache or drifting load does not favour either. Every process is
checked to be gone before the next measurement starts.

Target
------
Median cluster time divided by median bare time: at most 1.2. The same cluster without
its fork server (``fork_server=False``: every engine imports everything itself) is timed
alongside, so the fork server's share shows in the same run. The script reports the ratio
and never fails on it; it exits non-zero only when the benchmark itself could not run.

Usage
-----
``python bench/bringup.py [--quick] [--rounds N] [--no-warmup]``; ``--quick`` times one
round of each instead of three.
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time

import psutil
from _procs import reap

# Measured without a standby: its engines would boot alongside what is measured
# (bench/faults.py measures the standby).
os.environ.setdefault("JAXSYS_STANDBY", "0")


NPROCS = 4
DEVICES_PER_HOST = 2
TARGET = 1.2
# Measured side by side: the default cluster, one without the fork server, bare JAX.
KINDS = ("cluster", "no-fork", "bare")
READY = "JAXSYS_BENCH_READY"
# Generous for two slow cores, but every wait ends.
BARE_TIMEOUT = 120.0
CLUSTER_TIMEOUT = 120.0

# Kept to what the comparison is about: import, join, touch the devices, say so.
BARE_SCRIPT = f"""
import sys
rank, port, timeout = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
import jax
address = "127.0.0.1:" + port
jax.distributed.initialize(
    coordinator_address=address,
    num_processes={NPROCS},
    process_id=rank,
    coordinator_bind_address=address,
    initialization_timeout=timeout,
)
devices = jax.devices()
print("{READY}", rank, len(devices), flush=True)
"""


class BenchError(RuntimeError):
    """The benchmark could not run as intended."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def my_descendants() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def settle(label: str, leftovers: list[str]) -> None:
    """Make sure nothing from the last measurement is still running (or using CPU)."""
    stray = reap(my_descendants(), timeout=10)
    if stray:
        names = [f"{p.pid}" for p in stray]
        leftovers.extend(f"{label}: pid {n}" for n in names)
        print(
            f"warning: {label} left {len(stray)} process(es) behind; killed {names}",
            file=sys.stderr,
        )
    # Killed processes release memory asynchronously; give the two cores a moment back.
    time.sleep(1.0)


def time_cluster(fork_server: bool = True) -> dict:
    from jaxsys_kernel import Cluster

    stages: dict[str, float] = {}
    t0 = 0.0  # set just before start_sync; progress only fires inside it

    def progress(event) -> None:
        # Called on this thread while start_sync polls, so perf_counter here is meaningful
        # to within the 50 ms poll period.
        if event.done >= event.total and event.stage not in stages:
            stages[event.stage] = time.perf_counter() - t0

    cluster = Cluster(
        hosts=NPROCS,
        devices_per_host=DEVICES_PER_HOST,
        progress=progress,
        register_timeout=CLUSTER_TIMEOUT / 2,
        init_timeout=CLUSTER_TIMEOUT / 2,
        fork_server=fork_server,
    )
    try:
        t0 = time.perf_counter()
        cluster.start_sync()
        elapsed = time.perf_counter() - t0
        states = [p.state for p in cluster.processes]
        devices = [len(p.devices) for p in cluster.processes]
        if states != ["ready"] * NPROCS or devices != [DEVICES_PER_HOST] * NPROCS:
            raise BenchError(f"cluster came up wrong: states {states}, devices {devices}")
        return {
            "seconds": elapsed,
            "ready_seconds": cluster.ready_seconds,
            "registered": stages.get("engines registered"),
        }
    finally:
        kill_s = cluster.kill()
        if kill_s > 2.5:
            print(f"note: Cluster.kill() took {kill_s:.1f} s", file=sys.stderr)


def time_bare() -> dict:
    port = free_port()
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES_PER_HOST}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONUNBUFFERED"] = "1"
    lines: queue.SimpleQueue = queue.SimpleQueue()
    procs: list[subprocess.Popen] = []

    def pump(rank: int, stream) -> None:
        for line in stream:
            lines.put((rank, line))
        lines.put((rank, None))

    try:
        t0 = time.perf_counter()
        for rank in range(NPROCS):
            p = subprocess.Popen(
                [sys.executable, "-c", BARE_SCRIPT, str(rank), str(port), str(int(BARE_TIMEOUT))],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            procs.append(p)
            threading.Thread(target=pump, args=(rank, p.stdout), daemon=True).start()
        deadline = t0 + BARE_TIMEOUT
        ready: set[int] = set()
        output: dict[int, list[str]] = {r: [] for r in range(NPROCS)}
        while len(ready) < NPROCS:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise BenchError(
                    f"bare processes {sorted(set(range(NPROCS)) - ready)} not ready "
                    f"within {BARE_TIMEOUT:g} s:\n{_tails(output)}"
                )
            try:
                rank, line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                if rank not in ready:
                    raise BenchError(
                        f"bare process {rank} exited before it was ready:\n{_tails(output)}"
                    )
                continue
            output[rank].append(line)
            if line.startswith(READY):
                _, _, ndev = line.split()
                if int(ndev) != NPROCS * DEVICES_PER_HOST:
                    raise BenchError(f"bare process {rank} sees {ndev} devices")
                ready.add(rank)
        elapsed = time.perf_counter() - t0
        # Not timed: the processes leave through jax's shutdown barrier on their own.
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        return {"seconds": elapsed}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                print(f"warning: bare process pid {p.pid} did not die", file=sys.stderr)


def _tails(output: dict[int, list[str]]) -> str:
    return "\n".join(f"[{r}] " + "".join(v[-5:]).rstrip() for r, v in output.items())


def _run(kind: str) -> dict:
    return time_bare() if kind == "bare" else time_cluster(fork_server=kind == "cluster")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one timed round of each, not three")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds of each")
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed first round")
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)

    print(
        f"bringup: {NPROCS} processes x {DEVICES_PER_HOST} CPU devices, {rounds} timed "
        f"round(s) of each, alternating; {os.cpu_count()} CPUs",
        flush=True,
    )
    load0 = os.getloadavg()[0]
    leftovers: list[str] = []
    runs: dict[str, list[dict]] = {k: [] for k in KINDS}
    try:
        settle("before start", leftovers)
        if not args.no_warmup:
            warm = {}
            for kind in KINDS:
                warm[kind] = _run(kind)["seconds"]
                settle(f"warm-up {kind}", leftovers)
            print(
                "  warm-up: "
                + ", ".join(f"{k} {v:.2f} s" for k, v in warm.items())
                + " (not counted)",
                flush=True,
            )
        for i in range(rounds):
            for kind in KINDS:
                runs[kind].append(_run(kind))
                settle(f"{kind} round {i + 1}", leftovers)
            print(
                f"  round {i + 1}: "
                + ", ".join(
                    f"{k} {runs[k][-1]['seconds']:.2f} s"
                    + (
                        f" (engines registered at {runs[k][-1]['registered']:.2f} s)"
                        if k != "bare"
                        else ""
                    )
                    for k in KINDS
                ),
                flush=True,
            )
    finally:
        # Also covers an exception or ^C in the middle of a measurement.
        stray = reap(my_descendants(), timeout=10)
        if stray:
            print(f"warning: killed {len(stray)} leftover process(es) at exit", file=sys.stderr)

    med = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}
    header = f"{'kind':>8} {'median s':>9} {'min s':>7} {'max s':>7}  runs"
    print()
    print(header)
    print("-" * len(header))
    for kind, v in runs.items():
        t = [r["seconds"] for r in v]
        print(
            f"{kind:>8} {statistics.median(t):>9.2f} {min(t):>7.2f} {max(t):>7.2f}  "
            + " ".join(f"{x:.2f}" for x in t)
        )
    for kind in ("cluster", "no-fork"):
        reg = statistics.median(r["registered"] for r in runs[kind])
        print(
            f"{kind}: engines registered after {reg:.2f} s (median), "
            f"the remaining {med[kind] - reg:.2f} s identify ranks and initialise JAX"
        )
    if leftovers:
        print(f"processes left behind and killed: {', '.join(leftovers)}")
    print(
        f"load average (1 min) at start {load0:.1f}, at end {os.getloadavg()[0]:.1f}; "
        "anything else running on the machine slows every kind alike"
    )
    print()
    print(
        f"bringup: cluster/bare median ratio {med['cluster'] / med['bare']:.2f} "
        f"(cluster {med['cluster']:.2f} s, bare {med['bare']:.2f} s; target <= {TARGET}); "
        f"without the fork server {med['no-fork'] / med['bare']:.2f} "
        f"({med['no-fork']:.2f} s); fork server / none {med['cluster'] / med['no-fork']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
