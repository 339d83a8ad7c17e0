"""What telemetry costs at 1,024 processes: the hub's CPU, the bytes to the front end, and
a view update in chromium.

What is measured, in one run
----------------------------
1. **Hub CPU.** A real :class:`~jaxsys_kernel.telemetry.hub.TelemetryHub` (CurveZMQ on)
   receives N simulated agents (``tests/support_telemetry.py``: a socket per rank in a few
   worker processes, a heartbeat per rank per second plus cache events) for ``--seconds``.
   A real :class:`~jaxsys_kernel.kernel.comm.ClusterComms` with one front end pushes at
   the comm's rate, as the kernel does (the whole state once, then deltas). The CPU
   time of this process (hub thread and subscriber; the workers are other processes) over
   the window, as a percentage of one core. Target: <= 10 %.
2. **Bytes per second to the front end.** The JSON size of each message the comm sent,
   summed over the window, at N and at N / 8 side by side: above a group size the
   two are about equal (the state is a summary), where a state of every row grows with N.
3. **A view update in chromium.** The live-devices view (``widgets/static/live.js``)
   mounted in headless chromium with a stand-in model; the time from a trait change to the
   redrawn, laid-out view, for N rows and for one summary group's rows, side by side.
   Target: <= 300 ms.

Usage: ``python bench/telemetry_scale.py [--n 1024] [--seconds 15] [--no-browser]``.
Figures are printed and never fail the script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxsys_kernel.cluster.records import ProcessInfo  # noqa: E402
from jaxsys_kernel.kernel import comm  # noqa: E402
from jaxsys_kernel.telemetry import aggregate  # noqa: E402
from jaxsys_kernel.telemetry.hub import TelemetryHub  # noqa: E402
from tests.support_telemetry import SimulatedAgents, wait_for  # noqa: E402

HUB_CPU_TARGET = 10.0
RENDER_TARGET_MS = 300.0


def session_for(hub, n: int):
    """The kernel session the comm reads, for ``n`` ready processes on ``n`` hosts."""
    procs = [
        ProcessInfo(rank=r, host=f"node{r}", pid=10_000 + r, devices=[r], state="ready")
        for r in range(n)
    ]
    cluster = SimpleNamespace(
        state="ready",
        nprocs=n,
        processes=procs,
        telemetry=hub,
        security="mTLS",
        heartbeat_timeout=10.0,
        refresh_states=lambda: None,
    )
    return SimpleNamespace(cluster=cluster)


def hub_run(n: int, seconds: float) -> dict:
    """Hub CPU (% of a core) and state bytes per second for ``n`` agents at 1 Hz."""
    hub = TelemetryHub(n, curve=True, interval=1.0)
    session = session_for(hub, n)
    sizes: list[int] = []
    comms = comm.ClusterComms(session)
    front_end = SimpleNamespace(
        send=lambda data: sizes.append(len(json.dumps(data))),
        on_msg=lambda _f: None,
        on_close=lambda _f: None,
    )
    comms.on_open(front_end, {"content": {"data": {"v": comm.SCHEMA_VERSION}}})
    unsubscribe = comms.close
    try:
        with SimulatedAgents(hub, n, interval=1.0):
            wait_for(
                lambda: sum(1 for x in hub.liveness() if x.state == "alive") == n,
                f"{n} agents alive",
                timeout=60,
            )
            me = psutil.Process()
            comms.push(full=True)
            sizes.clear()
            cpu0, t0, got0 = me.cpu_times(), time.monotonic(), hub.received
            time.sleep(seconds)
            cpu1, t1, got1 = me.cpu_times(), time.monotonic(), hub.received
    finally:
        unsubscribe()
        hub.close()
    wall = t1 - t0
    cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return {
        "n": n,
        "cpu_pct": 100 * cpu / wall,
        "events_s": (got1 - got0) / wall,
        "bytes_s": sum(sizes) / wall,
        "state_bytes": statistics.median(sizes) if sizes else 0,
        "whole_bytes": len(json.dumps(comm.cluster_state(session))),
        "pushes_s": len(sizes) / wall,
        "every_row_bytes": len(json.dumps(every_row_state(session))),
    }


def every_row_state(session) -> dict:
    """The state as it was before summaries: every process's row."""
    state = comm.cluster_state(session)
    rows = comm._process_rows(session.cluster, {})
    state["cluster"].update(processes=rows, summary=None)
    return state


_PAGE = """<!doctype html><html><body><div id="out"></div><script type="module">
const src = %s;
const mod = await import(URL.createObjectURL(new Blob([src], {type: "text/javascript"})));
const data = {liveness: [], event_log: [], controls: true, control_status: "",
              telemetry_health: null};
const handlers = {};
const model = {get: (k) => data[k], set: (k, v) => { data[k] = v; }, save_changes() {},
  send() {}, on: (ev, cb) => { (handlers[ev] ||= []).push(cb); }, off() {}};
const el = document.getElementById("out");
mod.default.render({model, el});
window.update = async (rows, summary) => {
  const t0 = performance.now();
  data.liveness = rows;
  data.summary = summary || {};
  for (const cb of handlers["change:liveness"] || []) cb();
  await new Promise((r) => requestAnimationFrame(() => { void el.offsetHeight; r(); }));
  return performance.now() - t0;
};
window.ready = true;
</script></body></html>"""


def liveness_rows(n: int, tick: int) -> list[dict]:
    return [
        {
            "rank": r,
            "state": "dead" if (r + tick) % 97 == 0 else "alive",
            "heartbeat_age": (r + tick) % 3 / 2,
            "busy": (r + tick) % 4 == 0,
            "devices": [r],
            "incarnation": 1,
            "transfers": {},
        }
        for r in range(n)
    ]


def render_times(n: int, reps: int = 7) -> dict:
    """Median ms for the live view to redraw ``n`` rows and one group's rows."""
    from tests.browser import available, launch

    why = available()
    if why:
        return {"skipped": why}
    from jaxsys_kernel.widgets.esm import view_module

    page_html = _PAGE % json.dumps(view_module("live"))
    out = {}
    with launch() as page:
        page.set_content(page_html)
        page.wait_for_function("window.ready === true", timeout=30_000)
        # "group": what the view draws above the group size (the summary of every row and
        # one group's rows); "all": every row, as it drew before summaries.
        for label, rows in (("all", n), ("group", aggregate.group_size(n))):
            times = [
                page.evaluate(
                    "([rows, summary]) => window.update(rows, summary)",
                    [
                        liveness_rows(rows, i),
                        aggregate.summarize(liveness_rows(n, i)) if label == "group" else {},
                    ],
                )
                for i in range(reps)
            ]
            out[label] = statistics.median(times[1:])
            out[f"{label}_rows"] = rows
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024, help="simulated processes")
    ap.add_argument("--seconds", type=float, default=15.0, help="measuring window")
    ap.add_argument("--no-browser", action="store_true", help="skip the chromium part")
    args = ap.parse_args(argv)
    load0 = os.getloadavg()
    small_n = max(aggregate.ROWS_UP_TO + 1, args.n // 8)
    print(
        f"telemetry_scale: {args.n} and {small_n} simulated processes at 1 Hz, "
        f"{args.seconds:g} s each, {os.cpu_count()} CPUs",
        flush=True,
    )
    runs = [hub_run(small_n, args.seconds), hub_run(args.n, args.seconds)]
    for r in runs:
        print(
            f"  n={r['n']}: hub CPU {r['cpu_pct']:.1f} % of a core ({r['events_s']:.0f} "
            f"events/s), {r['bytes_s'] / 1e3:.1f} kB/s to the front end "
            f"({r['pushes_s']:.1f} deltas/s of {r['state_bytes'] / 1e3:.2f} kB; the whole "
            f"state {r['whole_bytes'] / 1e3:.1f} kB, every row {r['every_row_bytes'] / 1e3:.1f} kB)",
            flush=True,
        )
    small, large = runs
    print(
        f"bytes/s at n={large['n']} / at n={small['n']}: "
        f"{large['bytes_s'] / small['bytes_s']:.2f} (bounded: about 1)"
    )
    print(f"hub CPU at n={large['n']}: {large['cpu_pct']:.1f} % (target <= {HUB_CPU_TARGET:g} %)")
    if not args.no_browser:
        r = render_times(args.n)
        if "skipped" in r:
            print(f"chromium: skipped ({r['skipped']})")
        else:
            print(
                f"chromium, live view update: {r['all']:.1f} ms for {r['all_rows']} rows, "
                f"{r['group']:.1f} ms for the summary and one group's {r['group_rows']} rows, ratio "
                f"{r['all'] / r['group']:.1f} (target <= {RENDER_TARGET_MS:g} ms)"
            )
    load1 = os.getloadavg()
    print(
        f"load average (1, 5, 15 min): at start {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f}, "
        f"at end {load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
