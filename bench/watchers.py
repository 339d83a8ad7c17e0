"""What read-only watchers cost the owner of a cluster: trivial-cell time with 0 and N watchers.

What is measured
----------------
``jaxsys cluster start --name NAME --hosts 2 --devices-per-host 1`` owns a cluster. The
owner's trivial cell is ``pass`` executed on both processes through the cluster's
ipyparallel connection file (``view.execute(..., block=True)``), timed here with
``time.perf_counter``; a chunk is ``--cells`` such cells and its figure the median.

The owner (``jaxsys cluster start``'s server) writes its live numbers for watchers every
2 s in both halves (cache hits, step records asked only while the processes are idle); the
script prints the share of a core the server used meanwhile and the snapshot's size.

N real jaxsys kernels (started with jupyter_client, as a notebook server starts them) each
run ``%jaxsys watch NAME`` and then a cell that, while a flag file exists, runs
``%jaxsys status`` every ``--period`` seconds (what a dashboard refreshing once a second
asks) and otherwise only checks for the flag four times a second. Chunks alternate
between the flag off (*0 watching*) and on (*N watching*), so the drift of a shared
machine falls on both alike; a first chunk before any kernel is started (*no kernels*)
shows what the idle kernels themselves cost.

Target
------
Median of the N-watching chunks divided by the median of the 0-watching chunks: at most
1.01. The script prints the figures, the ratio and the load average, and never fails on
the ratio; it exits non-zero only when the benchmark itself could not run.

Usage
-----
``python bench/watchers.py [--watchers N] [--pairs N] [--cells N] [--period S]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import ipyparallel as ipp
import psutil
from _procs import cpu_seconds, reap
from jupyter_client.manager import KernelManager

from jaxsys_kernel.cluster.watch_snapshot import PERIOD, snapshot_path

JAXSYS = [sys.executable, "-m", "jaxsys_kernel.cli"]
#: Seconds one trivial cell may take before the benchmark gives up (a stuck cluster).
CELL_TIMEOUT = 60.0

WATCH_LOOP = """\
import os, time
_deadline = time.monotonic() + {limit}
while time.monotonic() < _deadline and not os.path.exists({stop!r}):
    if os.path.exists({on!r}):
        get_ipython().run_line_magic("jaxsys", "status")
        time.sleep({period})
    else:
        time.sleep(0.25)
"""


def chunk(view, cells: int) -> float:
    """The median seconds of ``cells`` trivial cells on every process."""
    took = []
    for _ in range(cells):
        t0 = time.perf_counter()
        view.execute("pass", block=False).get(timeout=CELL_TIMEOUT)
        took.append(time.perf_counter() - t0)
    return statistics.median(took)


def timed_cpu(procs: list, into: list, run):
    """``run()``, adding the CPU seconds ``procs`` used meanwhile and the wall seconds to
    ``into``; returns what ``run`` returned."""

    before, t0 = cpu_seconds(procs), time.perf_counter()
    result = run()
    into[0] += cpu_seconds(procs) - before
    into[1] += time.perf_counter() - t0
    return result


def start_watchers(n: int, name: str, env: dict, loop: str) -> list:
    """N kernels, each watching ``name`` and left running the polling cell."""
    kernels = []
    for _ in range(n):
        km = KernelManager(kernel_name="jaxsys")
        km.start_kernel(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        reply = kc.execute_interactive(
            f"%jaxsys watch {name}", timeout=60, output_hook=lambda _msg: None
        )
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"%jaxsys watch failed: {reply['content']}")
        kc.execute(loop)
        # The watcher's output is for its own front end: read here, it would cost this
        # process (which times the owner's cells) the work of ten front ends.
        kc.stop_channels()
        kernels.append((km, kc))
    return kernels


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--watchers", type=int, default=10)
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--cells", type=int, default=40)
    p.add_argument("--period", type=float, default=1.0)
    args = p.parse_args()
    # SIGTERM (a `timeout` wrapper) ends the run through the same clean-up as an error.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    name = f"bench-{uuid.uuid4().hex[:8]}"
    state_dir = Path(tempfile.mkdtemp(prefix="jaxsys-watch-bench-"))
    env = dict(os.environ, JAXSYS_STATE_DIR=str(state_dir), JAXSYS_STANDBY="0")
    flag_on, flag_stop = state_dir / "watching-on", state_dir / "watching-stop"
    kernels, client = [], None
    try:
        r = subprocess.run(
            [*JAXSYS, "cluster", "start", "--name", name, "--hosts", "2",
             "--devices-per-host", "1"],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        if r.returncode:
            print(r.stdout, r.stderr, file=sys.stderr)
            return 1
        state = json.loads((state_dir / f"{name}.json").read_text())
        client = ipp.Client(state["connection_file"])
        view = client[:]
        print(f"cluster {name!r} ready; timing the owner's cells", file=sys.stderr, flush=True)
        chunk(view, args.cells)  # warm up
        alone = chunk(view, args.cells)
        limit = 60 + args.pairs * args.cells * 2.0
        loop = WATCH_LOOP.format(limit=limit, stop=str(flag_stop), on=str(flag_on),
                                 period=args.period)  # fmt: skip
        kernels = start_watchers(args.watchers, name, env, loop)
        print(f"{len(kernels)} watchers started", file=sys.stderr, flush=True)
        procs = [psutil.Process(km.provisioner.process.pid) for km, _ in kernels]
        rss = statistics.mean(p.memory_info().rss for p in procs) / 2**20
        children = sum(len(p.children(recursive=True)) for p in procs)
        print(f"a watcher: one kernel process, {rss:.0f} MiB resident (mean of {len(procs)}); "
              f"processes they started: {children}")  # fmt: skip
        off, on = [], []
        cpu = {"off": [0.0, 0.0], "on": [0.0, 0.0]}  # watchers' CPU seconds, wall seconds
        # The owner's server writes its live numbers for watchers every 2 s, in both halves.
        owner = psutil.Process(state["pid"])
        owner_cpu, owner_t0 = sum(owner.cpu_times()[:2]), time.perf_counter()
        for _ in range(args.pairs):
            flag_on.unlink(missing_ok=True)
            time.sleep(2 * args.period)  # every watcher has seen the flag go
            off.append(timed_cpu(procs, cpu["off"], lambda: chunk(view, args.cells)))
            flag_on.touch()
            time.sleep(2 * args.period)
            on.append(timed_cpu(procs, cpu["on"], lambda: chunk(view, args.cells)))
        flag_stop.touch()
        owner_share = (sum(owner.cpu_times()[:2]) - owner_cpu) / (time.perf_counter() - owner_t0)
        live = snapshot_path(state_dir, name)
        m_off, m_on = statistics.median(off), statistics.median(on)
        print(f"owner's trivial cell, median of {args.pairs} chunks of {args.cells} cells:")
        print(f"  no kernels (before any watcher): {alone * 1e3:8.2f} ms")
        print(f"  0 watching ({args.watchers} idle):        {m_off * 1e3:8.2f} ms")
        print(f"  {args.watchers} watching (status every {args.period:g} s): {m_on * 1e3:8.2f} ms")
        print(f"ratio {args.watchers} watching / 0 watching: {m_on / m_off:.3f} (target <= 1.01)")
        pairs = [b / a for a, b in zip(off, on, strict=True)]
        print(f"median of adjacent-chunk ratios: {statistics.median(pairs):.3f}")
        print("load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
        print(f"CPUs: {os.cpu_count()}")
        print(
            f"the owner's server (writes {live.name}, {live.stat().st_size} bytes, every "
            f"{PERIOD:g} s): {100 * owner_share:.1f} % of one core"
        )
        for what, (used, wall) in cpu.items():
            print(
                f"the {args.watchers} watchers' CPU while {what}: {100 * used / wall:.1f} % of one core"
            )
        return 0
    finally:
        flag_stop.touch()
        if client is not None:
            client.close()
        for km, kc in kernels:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
        subprocess.run([*JAXSYS, "cluster", "stop", "--name", name], env=env,
                       capture_output=True, timeout=60)  # fmt: skip
        left = [c for c in psutil.Process().children(recursive=True)]
        reap(left, timeout=5)
        shutil.rmtree(state_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
