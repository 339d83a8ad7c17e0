"""The straggler view: is a delayed process named, with the right category, and what it costs.

What is measured
----------------
On one local cluster (``--hosts`` processes x 1 CPU device, 4 by default):

1. **Naming**, per category (host, input, compute): ``--trials`` times, one process drawn
   at random is delayed ``--ms`` before each step (``%jaxsys slow``), a cell runs 5 steps
   of a jitted training step whose result spans every process, and the view is read as
   ``%jaxsys where`` reads it. A trial counts when the delayed process is named with its
   category over those 5 steps. ``--undisturbed`` trials (as many by default) count a
   false name.
2. **Cost**, as ratios measured side by side in one run (A B B A A B ...): with the step
   records on and off, a cell of ``SHORT`` (2) steps, then one of ``--cost-steps`` (40).
   *Per step*: the long cell's time less the short one's, with / without, which leaves out
   what a cell costs once (its request and reply, and the first cell after the switch). *Per
   cell*: the long cells' times. Each is the median of the pairs' ratios, with a bootstrap
   95 % interval. Each process holds ``--live`` arrays (256), as a model's parameters do.
   Both again for the processes' CPU time over the same cells (every thread counted, the
   CPU devices' too): what the records add to the machine's work, less noisy than wall time
   where processes share cores.
   Twice: for a loop that dispatches its steps ahead (each step's end is stamped by a thread
   of the recorder's, which wakes once per step) and for one that waits for each step with
   ``block_until_ready`` (its end is stamped when that returns, on the main thread).
3. **Readiness gate** (``--import-delay S``, 0 skips it): a cluster of ``--hosts``
   processes whose last process waits ``S`` seconds before importing JAX, started with
   ``--init-timeout`` seconds (``--starts`` times): starts that succeeded, and their time.
4. **A death in JAX's own join** (``--join-deaths N``, 0 skips it): past the readiness gate,
   once every process has been asked to join, the last one gets SIGKILL; the time until the
   start's error names it (JAX's initialisation timeout is 60 s, its heartbeat 3 s).

The naming loop dispatches its steps ahead (``--loop ahead``) or waits for each
(``--loop synced``). A loop that dispatches ahead hides a host delay shorter than its step's
device time: nobody waits for the delayed process, and the view rightly names no one. With
many processes on few cores every step takes the cores' turns, so ``--rows`` (each
process's batch, 256 rows) keeps the step shorter than the delay there: measured at 32
processes on 2 cores with 256 rows, a 5-step cell took 2.50 s with a 200 ms host delay and
2.67 s without.

The figures: ``--trials 40`` at ``--hosts 8`` and at ``--hosts 32 --rows 16`` (a machine
with as many cores needs no smaller batch).

Usage
-----
``python bench/stragglers.py [--hosts N] [--trials N] [--undisturbed N] [--ms N] [--reps N] [--cost-steps N]
[--seed N] [--kinds host,input,compute] [--loop ahead|synced] [--rows N] [--live N] [--import-delay S] [--init-timeout S] [--starts N] [--register-timeout S]
[--join-deaths N]``
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import time

import psutil
from _procs import cpu_seconds

from jaxsys_kernel import Cluster
from jaxsys_kernel import cells as executor
from jaxsys_kernel.engine.registry import engine_module
from jaxsys_kernel.magics.actions_where import collect

os.environ.setdefault("JAXSYS_STANDBY", "0")
arrivals = engine_module("arrivals")

SETUP = """\
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("x",))
rows = NamedSharding(mesh, P("x"))
x = jax.make_array_from_process_local_data(rows, np.ones(({rows}, 1024), np.float32))
w = jnp.ones((1024, 1024), np.float32) * 1e-3
params = [jnp.full((16,), i, np.float32) for i in range({live})]  # held, as a model's arrays
@jax.jit
def step(w, x):
    g = jnp.tanh(x @ w).T @ x / x.shape[0]
    return w - 1e-3 * g
"""
# A cost pair's short cell, whose time is taken from its long one's (see _cost).
SHORT = 2
STEPS = "for _ in range({n}):\n    w = step(w, x)\nw.block_until_ready()\n"
# A loop that waits for each step, as one that prints its loss every step does.
SYNCED = "for _ in range({n}):\n    w = step(w, x)\n    w.block_until_ready()\n"


def run(cluster, code: str) -> float:
    t0 = time.perf_counter()
    r = executor.execute(cluster, code, sink=executor.Sink(), timeout=300, known=set())
    if r.failed():
        raise SystemExit(f"the cell failed: {r!r}")
    return time.perf_counter() - t0


def timed(cluster, code: str, procs: list[psutil.Process]) -> tuple[float, float]:
    """A cell's wall seconds and the seconds of CPU its processes spent meanwhile."""
    cpu = cpu_seconds(procs)
    wall = run(cluster, code)
    return wall, cpu_seconds(procs) - cpu


def call(cluster, ranks, fn, *args):
    calls = cluster.call(ranks, fn, *args, timeout=60.0)
    if calls.errors or calls.missing:
        raise SystemExit(f"{fn}: errors {calls.errors}, no answer from {calls.missing}")


def trial(cluster, slow: int | None, ms: float, where: str, loop: str) -> tuple:
    """One 5-step cell, ``slow`` delayed: what the view named, and the cell's seconds."""
    if slow is not None:
        call(cluster, [slow], arrivals.slow, ms, where)
    try:
        seconds = run(cluster, loop.format(n=5))
    finally:
        if slow is not None:
            call(cluster, [slow], arrivals.slow, None)
    return collect(cluster, cluster.ranks).named(5), seconds


def naming(cluster, trials, undisturbed, ms, rng, kinds, loop) -> None:
    print(f"naming a {ms:g} ms delay within 5 steps ({trials} trials each):")
    for where in kinds:
        right, times = 0, []
        for _ in range(trials):
            p = rng.choice(cluster.ranks)
            got, seconds = trial(cluster, p, ms, where, loop)
            right += got == (p, where)
            times.append(seconds)
            if got != (p, where):
                print(f"    p{p} delayed in {where}: named {got} ({seconds:.2f} s)")
        print(
            f"  {where:8s} named right {right}/{trials} ({100 * right / max(1, trials):.0f} %), "
            f"cell median {_median(times)}"
        )
    false, times = 0, []
    for _ in range(undisturbed):
        got, seconds = trial(cluster, None, ms, "host", loop)
        times.append(seconds)
        if got is not None:
            false += 1
            print(f"    undisturbed: named {got}")
    print(f"  undisturbed: a false name in {false}/{undisturbed}, cell median {_median(times)}")


def _median(times: list[float]) -> str:
    return f"{statistics.median(times):.2f} s" if times else "-"


def cost(cluster, reps: int, steps: int) -> None:
    """Both loops of :data:`STEPS` and :data:`SYNCED`, records on against off."""
    for loop, label in ((STEPS, "steps dispatched ahead"), (SYNCED, "each step waited for")):
        _cost(cluster, reps, steps, loop, label)


def _cost(cluster, reps: int, steps: int, loop: str, label: str) -> None:
    short, long = loop.format(n=SHORT), loop.format(n=steps)
    pids = cluster.call(cluster.ranks, os.getpid, timeout=60.0).values()
    procs = [psutil.Process(pid) for pid in pids.values()]
    # (wall, CPU) per cell, by (records on, steps in the cell)
    times: dict[tuple[bool, int], list[tuple[float, float]]] = {
        (on, n): [] for on in (True, False) for n in (SHORT, steps)
    }
    for i in range(reps + 1):
        # A B, then B A: whatever drifts within a pair (the order itself) cancels out.
        for on in (True, False) if i % 2 == 0 else (False, True):
            call(cluster, cluster.ranks, arrivals.enable if on else arrivals.disable)
            # The first cell after a switch pays for the switch (CPython's monitoring
            # instruments each call site again), which a training run pays once: the short
            # cell takes it, and takes the cell's own fixed cost, which the steps do not.
            a, b = timed(cluster, short, procs), timed(cluster, long, procs)
            if i:  # the first pair warms up
                times[on, SHORT].append(a)
                times[on, steps].append(b)
    step_ms = statistics.median(
        (c[0] - d[0]) / (steps - SHORT) * 1e3
        for c, d in zip(times[False, steps], times[False, SHORT], strict=True)
    )
    print(f"cost, {label}: {steps} steps of {step_ms:.1f} ms, {len(times[True, steps])} pairs")
    # Wall time is what the target is about; the processes' CPU time (every thread, the
    # devices' included on CPU) is what the records add to the machine's work, and it
    # moves less from pair to pair than wall time on a machine whose cores are shared.
    for k, what in ((0, "wall"), (1, "CPU")):
        on, off = [t[k] for t in times[True, steps]], [t[k] for t in times[False, steps]]
        # One step's share is the long cell's less the short one's, over the steps between:
        # the cell's fixed cost (its request, reply and output) falls out.
        per_step = [
            (a - b[k]) / (c - d[k])
            for a, b, c, d in zip(on, times[True, SHORT], off, times[False, SHORT], strict=True)
        ]
        cells = [x / y for x, y in zip(on, off, strict=True)]
        for name, ratios in (("per step", per_step), (f"per {steps}-step cell", cells)):
            q = statistics.quantiles(ratios, n=4)
            low, high = _median_interval(ratios)
            print(
                f"  {what}, {name}: with / without {statistics.median(ratios):.4f} "
                f"(95 % interval {low:.4f}-{high:.4f}; pairs' quartiles {q[0]:.3f}-{q[2]:.3f})"
            )


def _median_interval(values: list[float], resamples: int = 2000) -> tuple[float, float]:
    """A bootstrap 95 % interval of the median of ``values`` (fixed seed: repeatable)."""
    rng = random.Random(0)
    medians = sorted(
        statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples)
    )
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def gate(hosts: int, delay: float, init_timeout: float, starts: int, register_timeout=None) -> None:
    last = hosts - 1
    ok, took = 0, []
    for _ in range(starts):
        c = Cluster(
            hosts=hosts,
            devices_per_host=1,
            process_env={last: {"JAXSYS_IMPORT_DELAY": f"{last}:{delay:g}"}},
            progress=lambda e: None,
            init_timeout=init_timeout,
            register_timeout=register_timeout,
        )
        t0 = time.perf_counter()
        try:
            c.start_sync()
            ok += 1
            took.append(time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - a failed start is what is counted
            print(f"    start failed: {str(e).splitlines()[0]}")
        finally:
            c.kill()
    spent = f", {statistics.median(took):.1f} s median" if took else ""
    print(
        f"readiness gate: p{last} {delay:g} s slow to import, --init-timeout {init_timeout:g}: "
        f"{ok}/{starts} starts succeeded, {starts - ok} initialization timeouts{spent}"
    )


def _join_death(hosts: int, heartbeat: float) -> tuple[float, str] | None:
    """One start whose last process gets SIGKILL once every process was asked to join JAX:
    the seconds from the kill to the start's error, and the error (None: no kill or no error).
    """
    killed: list[float] = []

    def progress(event):
        if event.stage == "processes initialised" and event.done == 0 and not killed:
            killed.append(time.perf_counter())
            os.kill(c.world.processes[hosts - 1].pid, signal.SIGKILL)

    c = Cluster(hosts=hosts, devices_per_host=1, progress=progress, init_timeout=60,
                heartbeat_timeout=heartbeat)  # fmt: skip
    try:
        c.start_sync()
        print("    the start succeeded although a process was killed")
        return None
    except Exception as e:  # noqa: BLE001 - the error is what is measured
        if not killed:
            print(f"    the start failed before the join: {str(e).splitlines()[0]}")
            return None
        return time.perf_counter() - killed[0], str(e)
    finally:
        c.kill()


def join_deaths(hosts: int, starts: int, heartbeat: float = 3.0) -> None:
    """Kill the last process once the kernel has asked every process to join JAX; the time
    from the kill to the start's error naming it (target: JAX's heartbeat + 1 s)."""
    got = [r for r in (_join_death(hosts, heartbeat) for _ in range(starts)) if r]
    took = [t for t, _ in got]
    named = sum(f"process {hosts - 1} exited with code -9" in why for _, why in got)
    if took:
        print(
            f"death in JAX's join (p{hosts - 1} SIGKILLed, heartbeat {heartbeat:g} s): reported "
            f"in {statistics.median(took):.2f} s median, {max(took):.2f} s max; named {named}/{starts}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--undisturbed", type=int, default=None, help="(default: --trials)")
    ap.add_argument("--ms", type=float, default=200.0)
    ap.add_argument("--kinds", default="host,input,compute", help="delays to name, by category")
    ap.add_argument("--loop", choices=("ahead", "synced"), default="ahead", help="naming's loop")
    ap.add_argument("--rows", type=int, default=256, help="each process's batch rows")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--cost-steps", type=int, default=40, help="steps in a cost pair's long cell")
    ap.add_argument("--live", type=int, default=256, help="arrays each process holds, as a model's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--import-delay", type=float, default=20.0)
    ap.add_argument("--init-timeout", type=float, default=5.0)
    ap.add_argument("--starts", type=int, default=2)
    # The start's own deadline (registration and readiness): an import delay longer than
    # the default (60 s + 0.5 s per process) needs a longer one; JAX's timeout stays short.
    ap.add_argument("--register-timeout", type=float, default=None)
    ap.add_argument("--join-deaths", type=int, default=3, help="starts with a death in the join")
    opts = ap.parse_args()
    cluster = Cluster(hosts=opts.hosts, devices_per_host=1, progress=lambda e: None)
    cluster.start_sync()
    try:
        run(cluster, SETUP.format(rows=opts.rows, live=opts.live))
        call(cluster, cluster.ranks, arrivals.enable)
        run(cluster, STEPS.format(n=5))  # compiles the step
        quiet = opts.trials if opts.undisturbed is None else opts.undisturbed
        if opts.trials or quiet:
            kinds = opts.kinds.split(",")
            loop = STEPS if opts.loop == "ahead" else SYNCED
            naming(cluster, opts.trials, quiet, opts.ms, random.Random(opts.seed), kinds, loop)
        if opts.reps > 0:
            cost(cluster, opts.reps, opts.cost_steps)
    finally:
        cluster.kill()
    if opts.import_delay > 0:
        gate(opts.hosts, opts.import_delay, opts.init_timeout, opts.starts, opts.register_timeout)
    if opts.join_deaths > 0:
        join_deaths(opts.hosts, opts.join_deaths)
    print("load average: " + " ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()
