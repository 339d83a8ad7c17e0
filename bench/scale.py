"""How jaxsys grows with the number of processes on this machine.

What is measured, in one run
----------------------------
For each size N (default 2, 4, 8, 16, 32, 64; one CPU device per process, since the number
of devices takes no part in start-up or dispatch), a fresh local cluster is started and:

1. **ready**: seconds from ``Cluster.start`` until every process has initialised JAX, with
   the registration deadline left to grow with N (the default);
2. **memory**: each idle process's resident memory (psutil), mean and total; its
   proportional set size (shared pages split between the processes sharing them: forked
   processes share what the fork server imported); and what the machine's available
   memory dropped by from before the start until ready, per process;
3. **cell**: the round trip of a trivial cell (``x = 1``) through jaxsys's executor, median
   of a few after one warm-up;
4. **restart**: seconds for a world restart (every process replaced and re-initialised);
5. **idle CPU**: what the processes and the controller use while no cell runs, in
   milliseconds of CPU per second (per process, and the controller's processes together),
   over :data:`IDLE_WINDOW_S` after the first cell.

The growth per added process is the least-squares slope of each figure over N. Then, at
``--dispatch-at`` processes (32), ``%%multihost`` against ipyparallel's ``%%px`` on the same
engines of a real jaxsys kernel, driven over the Jupyter protocol by ``bench/dispatch.py``.
A size whose processes would not fit in the memory available now is skipped, saying so.

Usage: ``python bench/scale.py [--sizes 2,4,8,16,32,64] [--dispatch-at 32] [--reps 5]``.
The script prints figures and ratios and never fails on them; it exits non-zero only when
the benchmark itself could not run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _procs import cpu_seconds  # noqa: E402

from jaxsys_kernel import Cluster  # noqa: E402
from jaxsys_kernel import cells as executor  # noqa: E402
from jaxsys_kernel.cluster.records import ClusterStartError  # noqa: E402

# Measured without a standby: its engines would boot alongside what is measured
# (bench/faults.py measures the standby).
os.environ.setdefault("JAXSYS_STANDBY", "0")

# A process's memory when idle, measured here before the first run; used only to refuse a
# size that cannot fit before trying it (the run measures the real figure).
IDLE_PROCESS_BYTES = 260e6
# Headroom left for the kernel, the controller and everything else on the machine.
HEADROOM_BYTES = 2e9
TRIVIAL_CELL = "x = 1"
# Seconds over which idle CPU is measured.
IDLE_WINDOW_S = 3.0


class Quiet(executor.Sink):
    """Swallows the cells' output."""

    def stdout(self, text):
        pass

    stderr = stdout


def progress(n: int):
    """A progress callback that prints each stage's k/N at most every 10 %."""
    shown: dict[str, int] = {}

    def report(ev) -> None:
        step = max(1, ev.total // 10)
        if ev.done == ev.total or ev.done - shown.get(ev.stage, -step) >= step:
            shown[ev.stage] = ev.done
            print(f"    n={n}: {ev.stage} {ev.done}/{ev.total}", flush=True)

    return report


def fits(n: int, per_process: float) -> bool:
    """Whether ``n`` more processes fit in the memory available now."""
    return n * per_process + HEADROOM_BYTES <= psutil.virtual_memory().available


def measure(n: int, reps: int) -> dict:
    """Start, measure and stop one cluster of ``n`` processes."""
    cluster = Cluster(hosts=n, devices_per_host=1, progress=progress(n))
    try:
        available = psutil.virtual_memory().available
        t0 = time.perf_counter()
        cluster.start_sync()
        ready = time.perf_counter() - t0
        rss = [r["rss"] for r in cluster.status() if r["rss"] is not None]
        pss = proportional_sizes([p.pid for p in cluster.processes if p.pid])
        # What the machine lost: the processes, the controller and the fork server, with
        # pages shared between forked processes counted once.
        used = available - psutil.virtual_memory().available
        executor.raise_for_run(executor.execute(cluster, TRIVIAL_CELL, sink=Quiet()))
        idle_engine, idle_controller = idle_cpu(cluster)
        cells = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run = executor.execute(cluster, TRIVIAL_CELL, sink=Quiet())
            cells.append(time.perf_counter() - t0)
            executor.raise_for_run(run)
        restart = cluster.restart_sync()
        return {
            "n": n,
            "ready": ready,
            "restart": restart,
            "cell": statistics.median(cells),
            "rss_mean": statistics.mean(rss) if rss else float("nan"),
            "rss_total": sum(rss),
            "pss_mean": statistics.mean(pss) if pss else float("nan"),
            "used_per_process": used / n,
            "deadline": cluster.register_timeout,
            "idle_engine": idle_engine,
            "idle_controller": idle_controller,
        }
    finally:
        cluster.stop_sync()


def idle_cpu(cluster) -> tuple[float, float]:
    """Milliseconds of CPU a second, while idle: per process, and the controller's."""
    engines = [psutil.Process(p.pid) for p in cluster.processes if p.pid]
    ctl = psutil.Process(cluster.world.ipp.controller.process.pid)
    controller = [ctl, *ctl.children(recursive=True)]
    e0, c0, t0 = cpu_seconds(engines), cpu_seconds(controller), time.perf_counter()
    print(f"    idle CPU: measuring for {IDLE_WINDOW_S:g} s", flush=True)
    time.sleep(IDLE_WINDOW_S)  # the window itself is what is measured
    dt = time.perf_counter() - t0
    per_engine = (cpu_seconds(engines) - e0) / dt / max(1, len(engines)) * 1e3
    return per_engine, (cpu_seconds(controller) - c0) / dt * 1e3


def proportional_sizes(pids: list[int]) -> list[int]:
    """Each process's proportional set size: its own pages, and its share of pages it
    shares (forked processes share what their fork server imported)."""
    sizes = []
    for pid in pids:
        try:
            sizes.append(psutil.Process(pid).memory_full_info().pss)
        except (psutil.Error, AttributeError):
            pass
    return sizes


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares growth of a figure per added process."""
    if len(points) < 2:
        return float("nan")
    xs, ys = zip(*points, strict=True)
    mx, my = statistics.mean(xs), statistics.mean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else float("nan")


def dispatch_ratio(n: int, reps: int) -> float | None:
    """``%%multihost`` / ``%%px`` median round trip at ``n`` processes (bench/dispatch.py)."""
    import dispatch

    r = dispatch.measure(n, reps, warmup=3)
    if r["leftovers"]:
        print(f"  WARNING: left over after the kernel: {', '.join(r['leftovers'])}")
    mh, px = statistics.median(r["times"]["multihost"]), statistics.median(r["times"]["px"])
    print(
        f"  n={n}: %%multihost {mh * 1e3:.1f} ms, %%px {px * 1e3:.1f} ms "
        f"(medians of {reps}, interleaved)"
    )
    return mh / px


def print_table(results: list[dict]) -> None:
    header = (
        f"{'n':>4} {'ready s':>8} {'restart s':>9} {'cell ms':>8} "
        f"{'RSS MB':>7} {'PSS MB':>7} {'used MB':>8} {'GB RSS':>7} {'deadline s':>10} "
        f"{'idle ms/s':>9} {'ctl ms/s':>8}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for r in results:
        print(
            f"{r['n']:>4} {r['ready']:>8.1f} {r['restart']:>9.1f} {r['cell'] * 1e3:>8.1f} "
            f"{r['rss_mean'] / 1e6:>7.0f} {r['pss_mean'] / 1e6:>7.0f} "
            f"{r['used_per_process'] / 1e6:>8.0f} {r['rss_total'] / 1e9:>7.1f} "
            f"{r['deadline']:>10.0f} {r['idle_engine']:>9.2f} {r['idle_controller']:>8.1f}"
        )
    for key, unit, scale in (("ready", "s", 1), ("restart", "s", 1), ("cell", "ms", 1e3)):
        per = slope([(r["n"], r[key] * scale) for r in results])
        print(f"growth per added process: {key} {per:.3f} {unit}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2,4,8,16,32,64", help="process counts")
    ap.add_argument("--dispatch-at", type=int, default=32, help="0: skip the %%px comparison")
    ap.add_argument("--reps", type=int, default=5, help="timed trivial cells per size")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    load0 = os.getloadavg()
    print(
        f"scale: sizes {sizes}, {os.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total / 1e9:.0f} GB memory",
        flush=True,
    )
    results: list[dict] = []
    per_process = IDLE_PROCESS_BYTES
    for n in sizes:
        if not fits(n, per_process):
            avail = psutil.virtual_memory().available / 1e9
            print(
                f"  n={n}: skipped, {n} x {per_process / 1e6:.0f} MB does not fit in "
                f"the {avail:.1f} GB available",
                flush=True,
            )
            continue
        try:
            r = measure(n, args.reps)
        except ClusterStartError as e:
            # The sizes above this one would fail the same way; what was measured stands.
            print(f"  n={n}: did not start: {str(e).splitlines()[0]}", flush=True)
            break
        # What a process really cost the machine; resident sizes count shared pages in full.
        per_process = max(r["used_per_process"], 50e6)
        results.append(r)
        print(
            f"  n={n}: ready {r['ready']:.1f} s, restart {r['restart']:.1f} s, "
            f"cell {r['cell'] * 1e3:.1f} ms",
            flush=True,
        )
    print_table(results)
    ratio = dispatch_ratio(args.dispatch_at, 10) if args.dispatch_at else None
    if ratio is not None:
        print(f"%%multihost / %%px at {args.dispatch_at}: {ratio:.2f} (target <= 1.0)")
    load1 = os.getloadavg()
    print(
        f"load average (1, 5, 15 min): at start {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f}, "
        f"at end {load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
