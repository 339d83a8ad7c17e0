"""How fast faults are seen and recovered from, on a real 4-process cluster.

What is measured, in one run
----------------------------
1. **Kill -> shown dead.** A process is SIGKILLed from outside (``os.kill``, not through
   jaxsys), and the time until the cluster's view marks it dead (what ``%jaxsys status`` and
   the live-devices view show) is taken, alongside the time until the surviving processes'
   ``live_devices`` barrier leaves its devices out. Target: <= heartbeat + 1 s.
2. **Hang -> reported.** A cell where one process raises before a collective that the others
   enter; the time from the failure to the hang doctor's report. The deadline here is the
   grace period (``--grace``). Target: <= grace + 2 s.
3. **World restart -> ready** against a cold start of the same cluster, side by side at
   4 x 2 and 16 x 1: from the spare world (``spare_world=True``; target <= 0.25 of a cold
   start, and <= 0.3 s at 4 x 2), with the warm standby, and without either
   (``standby=0``). **One-process restart** from the standby (target <= 1 s).

Usage: ``python bench/faults.py [--quick] [--restarts-only]`` (``--quick``: one round of
each instead of 3; ``--restarts-only``: part 3 alone).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jaxsys_kernel import Cluster  # noqa: E402
from jaxsys_kernel import cells as executor  # noqa: E402
from jaxsys_kernel.magics.session import MultihostSession  # noqa: E402

HOSTS = 4
HEARTBEAT = 2.0
GRACE = 2.0
WAIT_LIMIT = 30.0


class Quiet(executor.Sink):
    def stdout(self, text):
        self.text = getattr(self, "text", "") + text

    stderr = stdout


def kill_to_dead(cluster: Cluster) -> tuple[float, float]:
    """Seconds until the cluster shows process 3 dead, and until JAX's survivors do."""
    victim = cluster.processes[HOSTS - 1]
    run = executor.execute(
        cluster,
        "import jax, jaxsys_kernel\nwith jaxsys_kernel.live_devices() as d: pass",
        sink=Quiet(),
    )
    executor.raise_for_run(run)
    t0 = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    deadline = t0 + WAIT_LIMIT
    while time.monotonic() < deadline:
        cluster.refresh_states()
        if victim.state == "dead":
            break
        time.sleep(0.005)
    shown = time.monotonic() - t0
    survivors = list(range(HOSTS - 1))
    sink = Quiet()
    run = executor.execute(
        cluster,
        "import time\n"
        "from jax.experimental import multihost_utils as mu\n"
        "while True:\n"
        "    try:\n"
        "        with jaxsys_kernel.live_devices() as d:\n"
        "            pass\n"
        "    except mu.ProcessFailureError:\n"
        "        break\n"
        "    if len(d) < jax.device_count():\n"
        "        break\n"
        "print(time.time())\n",
        survivors,
        sink=sink,
        timeout=WAIT_LIMIT,
    )
    executor.raise_for_run(run)
    seen_at = max(float(line.split()[-1]) for line in sink.text.splitlines())
    killed_at = time.time() - (time.monotonic() - t0)  # the kill's moment on the wall clock
    return shown, seen_at - killed_at


def hang_to_report(session: MultihostSession) -> float:
    """Seconds from a process's failure to the hang doctor's report."""
    code = (
        "import time, jax, numpy as np\n"
        "from jax.experimental import multihost_utils\n"
        "if jax.process_index() == 1:\n"
        "    print('failing at', time.time())\n"
        "    raise ValueError('fails before the collective')\n"
        "multihost_utils.process_allgather(np.ones(3))\n"
    )
    out = io.StringIO()
    reported_at = None

    class Timed(io.StringIO):
        def write(self, s):
            nonlocal reported_at
            if reported_at is None and "hang doctor" in s:
                reported_at = time.time()
            return super().write(s)

    timed = Timed()
    with contextlib.redirect_stderr(timed), contextlib.redirect_stdout(out):
        try:
            session.run_cell(code, grace=GRACE)
        except Exception:  # noqa: BLE001 - the cell is meant to fail
            pass
    failed_at = float(
        next(ln for ln in out.getvalue().splitlines() if "failing at" in ln).split()[-1]
    )
    session.restart()
    return reported_at - failed_at


STANDBY_WAIT_S = 180.0


def _standby_ready(cluster: Cluster) -> None:
    deadline = time.monotonic() + STANDBY_WAIT_S
    while cluster.standby_status()["ready"] < cluster.nprocs:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the standby never filled: {cluster.standby_status()}")
        time.sleep(0.05)


def _spare_ready(cluster: Cluster) -> None:
    deadline = time.monotonic() + STANDBY_WAIT_S
    while cluster.world.spare_world.state != "ready":
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the spare world never got ready: {cluster.world.spare_world.line()}"
            )
        time.sleep(0.05)


# How each kind of world restart is set up: the cluster's options.
RESTART_KINDS = {
    "standby": lambda hosts: {"standby": hosts},
    "plain": lambda hosts: {"standby": 0},
    "spare": lambda hosts: {"standby": 0, "spare_world": True},
}


def restart_times(hosts: int, devices: int, rounds: int) -> dict[str, list[float]]:
    """Cold start, world restart from the spare world, with and without the standby, and
    one-process restart."""
    out: dict[str, list[float]] = {"cold": [], "one": [], **{k: [] for k in RESTART_KINDS}}
    for kind, options in RESTART_KINDS.items():
        cluster = Cluster(
            hosts=hosts, devices_per_host=devices, progress=lambda e: None, **options(hosts)
        )
        t0 = time.perf_counter()
        cluster.start_sync()
        out["cold"].append(time.perf_counter() - t0)
        try:
            for _ in range(rounds):
                if kind == "standby":
                    _standby_ready(cluster)
                    out["standby"].append(cluster.restart_sync())
                    assert cluster.standby_status()["taken"] == hosts
                    _standby_ready(cluster)
                    out["one"].append(cluster.restart_process_sync(hosts - 1))
                elif kind == "spare":
                    _spare_ready(cluster)
                    out["spare"].append(cluster.restart_sync())
                    assert cluster.world.spare_world.last_swapped
                else:
                    out["plain"].append(cluster.restart_sync())
        finally:
            cluster.kill()
    return out


def print_restarts(rounds: int) -> None:
    med = statistics.median
    print(
        f"{'shape':8} {'cold s':>7} {'spare s':>8} {'standby s':>10} {'plain s':>8} {'one s':>6}"
        f" {'spare/cold':>11} {'standby/cold':>13} {'plain/cold':>11}"
    )
    for hosts, devices in ((4, 2), (16, 1)):
        t = restart_times(hosts, devices, rounds)
        cold = med(t["cold"])
        print(
            f"{f'{hosts} x {devices}':8} {cold:7.2f} {med(t['spare']):8.3f} "
            f"{med(t['standby']):10.2f} {med(t['plain']):8.2f} {med(t['one']):6.2f} "
            f"{med(t['spare']) / cold:11.3f} {med(t['standby']) / cold:13.2f} "
            f"{med(t['plain']) / cold:11.2f}"
        )
        print(f"{'':8} spare runs: {' '.join(f'{x:.3f}' for x in t['spare'])}")
    print(
        "targets: world restart/cold <= 0.25 and <= 0.3 s at 4 x 2 (spare world), "
        "one-process restart <= 1 s"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--restarts-only", action="store_true", help="only measure part 3")
    args = ap.parse_args(argv)
    rounds = 1 if args.quick else 3
    print("load average (1, 5, 15 min): {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    if args.restarts_only:
        print_restarts(rounds)
        print("load average (1, 5, 15 min): {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
        return 0
    shown, seen, reported, restarts, colds = [], [], [], [], []
    session = MultihostSession()
    for _ in range(rounds):
        cold = Cluster(
            hosts=HOSTS,
            devices_per_host=1,
            heartbeat_timeout=HEARTBEAT,
            standby=0,
            progress=lambda e: None,
        )
        t0 = time.perf_counter()
        cold.start_sync()
        colds.append(time.perf_counter() - t0)
        try:
            a, b = kill_to_dead(cold)
            shown.append(a)
            seen.append(b)
            restarts.append(cold.restart_sync())
            session.cluster = cold
            reported.append(hang_to_report(session))
        finally:
            cold.kill()
    med = statistics.median
    print(f"{'measure':38} {'median s':>9}  runs")
    print(
        f"{'kill -> shown dead (cluster view)':38} {med(shown):9.3f}  {' '.join(f'{x:.3f}' for x in shown)}"
    )
    print(
        f"{'kill -> survivors drop its devices':38} {med(seen):9.3f}  {' '.join(f'{x:.2f}' for x in seen)}"
    )
    print(
        f"{'failure -> hang reported':38} {med(reported):9.3f}  {' '.join(f'{x:.2f}' for x in reported)}"
    )
    print(f"{'cold start':38} {med(colds):9.3f}  {' '.join(f'{x:.2f}' for x in colds)}")
    print(f"{'world restart':38} {med(restarts):9.3f}  {' '.join(f'{x:.2f}' for x in restarts)}")
    print()
    print(
        f"faults: kill->dead {med(shown):.2f} s (JAX survivors {med(seen):.1f} s; target <= "
        f"{HEARTBEAT + 1:g} s), hang->reported {med(reported):.1f} s (target <= {GRACE + 2:g} s), "
        f"restart/cold {med(restarts) / med(colds):.2f} (target <= 1.5)"
    )
    print()
    print_restarts(rounds)
    print("load average (1, 5, 15 min): {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
