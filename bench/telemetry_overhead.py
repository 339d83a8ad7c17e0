"""What live dashboards cost a training loop: steps per second with telemetry on or off.

What is measured
----------------
A jitted data-parallel SGD step runs on a cluster of four JAX processes with two CPU devices
each (``Cluster(hosts=4, devices_per_host=2)``, eight devices in one JAX world). Every
process feeds its own slice of the batch (``make_array_from_process_local_data`` over
``P("data")``); inside ``shard_map`` each device takes the gradient of a small tanh
regression on its shard, the gradients are ``psum``'d over ``"data"`` and every device
applies the same update to its replicated weights, so each step is a cross-process
collective. The loop runs inside the engines (sent with ``cluster.view.execute``, so the
engines' IPython cell hooks fire as they do for a notebook cell, and the agents report the
processes busy) and is timed there with ``time.perf_counter`` around a fixed number of
steps, ending with ``block_until_ready``, after a few untimed steps. The figure for one
chunk is the mean over the four processes of steps / seconds; they run in lock step, so
the four agree closely.

Two setups are compared:

*live*: ``Cluster(..., telemetry=True)``, and in this process a
:class:`jaxsys_kernel.magics.session.MultihostSession` holding that cluster calls its own
``show_dashboard()``, the code behind ``%jaxsys dashboard``: it builds a
:class:`jaxsys_kernel.widgets.Dashboard` (whose mesh and sharding panes hold process 0's
summaries of the training mesh and batch) and subscribes to the telemetry hub at up to 10
updates a second, refreshing process states, liveness and cache numbers and pushing them
into the widgets. There is no front end: ``comm.create_comm`` is replaced by a comm that
JSON-encodes every message it is asked to send (the work a kernel does before writing to
its iopub socket) and then drops it. So everything a live dashboard costs is paid: the
agents in the engines, the hub's thread, and the widget updates in the kernel process.

*none*: ``Cluster(..., telemetry=False)``: no agents, no hub, no dashboard.

Two more setups help to read the result: *agents* (telemetry on, no dashboard) splits the
cost between the agents and the dashboard, and comparing *none* with *none* (a control run)
shows how far apart two identical setups land on this machine.

Both clusters are started once, one after the other, and the loop is compiled and warmed
up on both. Then timed chunks alternate between them (live, none, live, none, ...), so the
slow drift of a shared machine (other jobs coming and going) hits both setups alike, which
separate runs of a minute each cannot achieve. While one setup runs its chunk the other
sits idle; the live setup's dashboard is unsubscribed from its hub meanwhile, and resubscribed
(the same callback) before its own next chunk. What an idle setup still costs (ipyparallel's
heartbeats in both; the agents' one-a-second heartbeats and the hub thread in the live one)
falls on the other setup's chunks; the CPU time it used during them is measured (its
processes, plus the hub's thread in this process) and reported as *idle CPU*, which bounds
that bias. (Freezing the idle cluster with SIGSTOP would remove it, but JAX processes that
were stopped for several seconds were seen to die on resumption, so it is not done.)

Target
------
Median steps/s with live dashboards divided by median steps/s without: at least 0.97. The
median of the ratios of adjacent live/none chunks is shown too. The script reports the
ratio and never fails on it; it exits non-zero only when the benchmark itself could not
run.

Usage
-----
``python bench/telemetry_overhead.py [--quick] [--pairs N] [--steps N] [--compare A,B]``;
``--quick`` times 8 pairs of chunks of 100 steps instead of 24 pairs of 150; ``--compare``
picks the two setups (default ``live,none``; e.g. ``none,none`` or ``agents,none``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import psutil
from _procs import cpu_seconds, reap

# Measured without a standby: its engines would boot alongside what is measured
# (bench/faults.py measures the standby).
os.environ.setdefault("JAXSYS_STANDBY", "0")

NPROCS = 4
DEVICES_PER_HOST = 2
TARGET = 0.97
KINDS = ("live", "agents", "none")
MAX_RATE = 10.0  # dashboard updates per second, as %jaxsys dashboard uses
START_TIMEOUT = 120.0
CHUNK_TIMEOUT = 300.0

# Runs once in every engine: a data-parallel SGD step over all devices of all processes.
SETUP = """
import time as _jx_time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

_jx_mesh = jax.make_mesh((jax.device_count(),), ("data",))
_JX_B, _JX_D = 64, 128  # rows per device, features


def _jx_loss(w, x, y):
    return jnp.mean((jnp.tanh(x @ w) - y) ** 2)


def _jx_local_step(w, x, y):
    g = jax.grad(_jx_loss)(w, x, y)
    g = jax.lax.psum(g, "data") / jax.lax.axis_size("data")
    return w - 0.05 * g


_jx_step = jax.jit(
    jax.shard_map(
        _jx_local_step,
        mesh=_jx_mesh,
        in_specs=(P(), P("data"), P("data")),
        out_specs=P(),
    )
)
_jx_rng = np.random.default_rng(jax.process_index())
_jx_rows = _JX_B * jax.local_device_count()
_jx_batch = NamedSharding(_jx_mesh, P("data"))
_jx_x = jax.make_array_from_process_local_data(
    _jx_batch, _jx_rng.standard_normal((_jx_rows, _JX_D), dtype=np.float32)
)
_jx_y = jax.make_array_from_process_local_data(
    _jx_batch, _jx_rng.standard_normal((_jx_rows, _JX_D), dtype=np.float32)
)
_jx_w = jax.device_put(jnp.zeros((_JX_D, _JX_D), jnp.float32), NamedSharding(_jx_mesh, P()))


def _jx_run(n, untimed=5):
    global _jx_w
    for _ in range(untimed):
        _jx_w = _jx_step(_jx_w, _jx_x, _jx_y)
    _jx_w.block_until_ready()
    t0 = _jx_time.perf_counter()
    for _ in range(n):
        _jx_w = _jx_step(_jx_w, _jx_x, _jx_y)
    _jx_w.block_until_ready()
    return n / (_jx_time.perf_counter() - t0)
"""

# The summaries a user would have displayed before opening the dashboard.
SUMMARIES = """
from jaxsys_kernel.engine import summaries as _jx_summaries

_jx_views = {
    "mesh": _jx_summaries.mesh_info(_jx_mesh),
    "sharding": _jx_summaries.sharding_info(_jx_x),
}
"""


class BenchError(RuntimeError):
    """The benchmark could not run as intended."""


# -- processes --------------------------------------------------------------------------------


def my_descendants() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def _tree(roots: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in roots:
        try:
            out.append(p)
            out.extend(p.children(recursive=True))
        except psutil.Error:
            pass
    return out


# -- the dashboard without a front end -----------------------------------------------------------


class _Wire:
    """Counts what the widgets would have sent to a front end."""

    messages = 0
    bytes = 0


def _serializing_comm_class():
    from comm.base_comm import BaseComm

    class SerializingComm(BaseComm):
        """A comm that encodes each message as a kernel would, then drops it."""

        def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
            raw = json.dumps(
                {"msg_type": msg_type, "comm_id": self.comm_id, "data": data, "meta": metadata},
                default=str,
            )
            _Wire.messages += 1
            _Wire.bytes += len(raw) + sum(len(memoryview(b)) for b in buffers or ())

    return SerializingComm


class LiveDashboard:
    """``%jaxsys dashboard`` on ``cluster``, run by the session code behind the magic.

    :meth:`pause` and :meth:`resume` take the dashboard's subscription off the hub and put
    the same callback back, for while the other setup is measured.
    """

    def __init__(self, cluster):
        import comm

        from jaxsys_kernel.magics.session import MultihostSession

        self._comm_module = comm
        self._saved = comm.create_comm
        self.hub = cluster.telemetry
        self.updates = 0
        captured: list[tuple] = []
        real_subscribe = self.hub.subscribe

        def capture(callback, max_rate=100.0):
            captured.append((callback, max_rate))
            return real_subscribe(callback, max_rate=max_rate)

        comm.create_comm = _serializing_comm_class()
        self.hub.subscribe = capture
        try:
            session = MultihostSession(shell=None)
            session.cluster = cluster
            cluster.view.execute(SUMMARIES, block=False).get(timeout=CHUNK_TIMEOUT)
            eid = cluster.engine_ids([0])[0]
            views = cluster.client[eid].pull("_jx_views", block=False).get(timeout=30)
            session.last_summaries.update(views)
            dash = session.show_dashboard(max_rate=MAX_RATE)
        except BaseException:
            comm.create_comm = self._saved
            raise
        finally:
            del self.hub.subscribe  # back to the class's method
        if len(captured) != 1:
            raise BenchError(f"show_dashboard subscribed {len(captured)} times, expected once")
        self._callback, self._rate = captured[0]
        self.session, self.dash = session, dash
        update = dash.update

        def counted(**kwargs):
            self.updates += 1
            update(**kwargs)

        # The subscription calls dash.update through the instance: count those calls.
        dash.update = counted

    def pause(self) -> None:
        if self.session._unsubscribe is not None:
            self.session._unsubscribe()
            self.session._unsubscribe = None

    def resume(self) -> None:
        if self.session._unsubscribe is None:
            self.session._unsubscribe = self.hub.subscribe(self._callback, max_rate=self._rate)

    def close(self) -> None:
        self.pause()
        self._comm_module.create_comm = self._saved


# -- the two setups ------------------------------------------------------------------------------


class Setup:
    """One cluster: ``live`` (telemetry and a dashboard), ``agents`` (telemetry only) or
    ``none``; ``label`` names it in the report."""

    def __init__(self, kind: str, label: str | None = None):
        from jaxsys_kernel import Cluster

        if kind not in KINDS:
            raise ValueError(f"unknown setup {kind!r}; choose from {', '.join(KINDS)}")
        self.kind = label or kind
        self.live = kind != "none"  # the cluster runs with telemetry
        self.with_dashboard = kind == "live"
        self.cluster = Cluster(
            hosts=NPROCS,
            devices_per_host=DEVICES_PER_HOST,
            progress=lambda e: None,
            register_timeout=START_TIMEOUT / 2,
            init_timeout=START_TIMEOUT / 2,
            telemetry=self.live,
        )
        self.dash: LiveDashboard | None = None
        self.roots: list[psutil.Process] = []
        self._idle0: float | None = None
        self.rates: list[float] = []
        self.spread = 0.0
        self.active_s = 0.0
        self.updates = 0
        self.events = 0
        self.idle_cpu_s = 0.0
        self.procs: list[psutil.Process] = []
        self.cluster_cpu_s = 0.0
        self.kernel_cpu_s = 0.0
        self.steps = 0

    def start(self, warmup: int) -> None:
        before = {p.pid for p in psutil.Process().children()}
        self.cluster.start_sync()
        # Everything the cluster started is a new child of this process (or below one).
        self.roots = [p for p in psutil.Process().children() if p.pid not in before]
        self.procs = _tree(self.roots)
        if (self.cluster.telemetry is not None) != self.live:
            raise BenchError(f"{self.kind}: cluster.telemetry is {self.cluster.telemetry!r}")
        self.cluster.view.execute(SETUP, block=False).get(timeout=CHUNK_TIMEOUT)
        if self.with_dashboard:
            self.dash = LiveDashboard(self.cluster)
        self.run(warmup)  # compiles, warms caches and the collectives

    def run(self, n: int) -> list[float]:
        """Run ``n`` timed steps on every process; return each process's steps/s."""
        view = self.cluster.view
        # silent=False, as for a notebook cell: the engines' cell hooks run (busy heartbeats).
        code = f"_jx_rate = _jx_run({n})"
        view.execute(code, silent=False, block=False).get(timeout=CHUNK_TIMEOUT)
        return [float(r) for r in view.pull("_jx_rate", block=False).get(timeout=30)]

    def chunk(self, n: int) -> float:
        hub = self.cluster.telemetry
        events0 = hub.received if hub is not None else 0
        updates0 = self.dash.updates if self.dash is not None else 0
        me = psutil.Process()
        cpu0, kernel0 = cpu_seconds(self.procs), cpu_seconds([me])
        t0 = time.perf_counter()
        rates = self.run(n)
        self.active_s += time.perf_counter() - t0
        self.cluster_cpu_s += cpu_seconds(self.procs) - cpu0
        self.kernel_cpu_s += cpu_seconds([me]) - kernel0
        self.steps += n
        if hub is not None:
            self.events += hub.received - events0
        if self.dash is not None:
            self.updates += self.dash.updates - updates0
        self.spread = max(self.spread, (max(rates) - min(rates)) / max(rates))
        self.rates.append(statistics.fmean(rates))
        return self.rates[-1]

    def _background_cpu(self) -> float:
        """CPU seconds of this setup's processes and of its hub's thread in this process."""
        total = cpu_seconds(self.procs)
        hub = self.cluster.telemetry
        if hub is not None:
            ident = hub._thread.native_id
            for t in psutil.Process().threads():
                if t.id == ident:
                    total += t.user_time + t.system_time
        return total

    def pause(self) -> None:
        """Go idle while the other setup runs a chunk."""
        if self.dash is not None:
            self.dash.pause()
        self._idle0 = self._background_cpu()

    def resume(self) -> None:
        if self._idle0 is not None:
            self.idle_cpu_s += self._background_cpu() - self._idle0
            self._idle0 = None
        if self.dash is not None:
            self.dash.resume()

    def close(self) -> None:
        if self.dash is not None:
            self.dash.close()
        self.cluster.kill()


# -- report ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 pairs of 100-step chunks")
    ap.add_argument("--pairs", type=int, default=None, help="timed chunks of each setup")
    ap.add_argument("--steps", type=int, default=None, help="steps per timed chunk")
    ap.add_argument("--warmup", type=int, default=50, help="untimed steps after start-up")
    ap.add_argument(
        "--compare",
        default="live,none",
        help="the two setups, from live, agents (telemetry without a dashboard) and none; "
        "none,none is a control run that shows the noise floor",
    )
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.compare.split(",")]
    if len(kinds) != 2 or any(k not in KINDS for k in kinds):
        ap.error(f"--compare takes two of {', '.join(KINDS)}, e.g. live,none")
    pairs = args.pairs or (8 if args.quick else 24)
    steps = args.steps or (100 if args.quick else 150)

    print(
        f"telemetry_overhead: {NPROCS} processes x {DEVICES_PER_HOST} CPU devices per setup; "
        f"{pairs} pairs of alternating {steps}-step chunks ({kinds[0]}, {kinds[1]}, ...), "
        "the other setup "
        f"idle; dashboard at <= {MAX_RATE:g} updates/s; {os.cpu_count()} CPUs",
        flush=True,
    )
    load0 = os.getloadavg()[0]
    same = kinds[0] == kinds[1]
    a = Setup(kinds[0], f"{kinds[0]}-a" if same else None)
    b = Setup(kinds[1], f"{kinds[1]}-b" if same else None)
    setups = (a, b)
    try:
        for s in setups:
            t0 = time.perf_counter()
            s.start(args.warmup)
            print(
                f"  {s.kind}: cluster up in {s.cluster.ready_seconds:.1f} s, step compiled and "
                f"warmed up in {time.perf_counter() - t0 - s.cluster.ready_seconds:.1f} s; "
                f"{len(s.procs)} processes",
                flush=True,
            )
        for s in setups:
            s.pause()
        for i in range(pairs):
            for s in setups:
                s.resume()
                s.chunk(steps)
                s.pause()
            print(
                f"  pair {i + 1:>2}: {a.kind} {a.rates[-1]:6.1f}  {b.kind} {b.rates[-1]:6.1f} "
                f"steps/s  ({a.rates[-1] / b.rates[-1]:.3f})",
                flush=True,
            )
        for s in setups:
            s.resume()
            if s.live:
                states = [x.state for x in s.cluster.telemetry.liveness()]
                if "dead" in states or "stuck" in states:
                    raise BenchError(f"{s.kind}: the hub saw process states {states}")
            if s.dash is not None and s.updates == 0:
                raise BenchError(f"{s.kind}: the dashboard was never updated while the loop ran")
    finally:
        for s in setups:
            s.close()
        stray = reap(my_descendants(), timeout=10)
        if stray:
            print(f"warning: killed {len(stray)} leftover process(es) at exit", file=sys.stderr)

    header = (
        f"{'setup':>6} {'median steps/s':>15} {'p10':>7} {'p90':>7} {'proc spread':>11} "
        f"{'dash upd/s':>10} {'events/s':>8} {'CPU ms/step':>11} {'kernel CPU':>10} "
        f"{'idle CPU s':>10}"
    )
    print()
    print(header)
    print("-" * len(header))
    med = {}
    for s in setups:
        med[s.kind] = statistics.median(s.rates)
        q = statistics.quantiles(s.rates, n=10) if len(s.rates) > 1 else s.rates * 9
        upd = f"{s.updates / s.active_s:.1f}" if s.dash is not None else "-"
        ev = f"{s.events / s.active_s:.1f}" if s.live else "-"
        print(
            f"{s.kind:>6} {med[s.kind]:>15.2f} {q[0]:>7.2f} {q[-1]:>7.2f} "
            f"{s.spread * 100:>10.1f}% {upd:>10} {ev:>8} "
            f"{1e3 * s.cluster_cpu_s / s.steps:>11.2f} "
            f"{100 * s.kernel_cpu_s / s.active_s:>9.1f}% {s.idle_cpu_s:>10.2f}"
        )
    pair_ratios = [x / y for x, y in zip(a.rates, b.rates, strict=True)]
    name = f"{a.kind}/{b.kind}"
    print()
    print(
        f"adjacent {name} chunks: median ratio {statistics.median(pair_ratios):.3f}, "
        f"range {min(pair_ratios):.3f}-{max(pair_ratios):.3f}; dashboard sent {_Wire.messages} "
        f"comm messages ({_Wire.bytes / 1024:.0f} KiB, widget creation included)"
    )
    cpu = {s.kind: (s.cluster_cpu_s + s.kernel_cpu_s) / s.steps for s in setups}
    print(
        f"CPU time per step, cluster and kernel process together: {name} "
        f"{cpu[a.kind] / cpu[b.kind]:.3f} (less sensitive to other load than steps/s); "
        "kernel CPU is this process's share of one core while the setup ran"
    )
    print(
        f"load average (1 min) at start {load0:.1f}, at end {os.getloadavg()[0]:.1f}; "
        "anything else running on the machine slows both setups alike"
    )
    print()
    ratio = med[a.kind] / med[b.kind]
    numbers = f"{a.kind} {med[a.kind]:.1f}, {b.kind} {med[b.kind]:.1f} steps/s"
    if kinds == ["live", "none"]:
        print(
            f"telemetry_overhead: live/none steps/s ratio {ratio:.2f} "
            f"({numbers}; target >= {TARGET:.2f})"
        )
    else:
        print(f"telemetry_overhead: {name} steps/s ratio {ratio:.2f} ({numbers}; not the target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
