"""Output collation on a real cluster: exact lines, identical lines once, streaming delay.

What is measured
----------------
A cluster of N processes (1 CPU device each) is started in this process, and cells are run
through the same path ``%%multihost`` uses (``cells.execute`` with a capturing sink). After a
setup cell, ``--cells`` cells (20 by default) each run a *first-time* cross-process collective
(a freshly defined ``jax.jit`` function summing a global array, then
``multihost_utils.sync_global_devices`` with a fresh name) and print:

- three lines every process prints identically (``n``, the sum, ``done``): the first right
  after the first compilation of the cell's collective, when arrival times spread most;
- one line that differs per process (its rank);
- one line that only process 0 prints, between them.

Then one *long* cell runs 8 steps, 1.5 s apart, each a fresh collective followed by an
identical, a per-process and a process-0-only line, so that lines are shown while the cell
runs rather than when it ends.

Every line the user's code prints starts with ``bench:``; the report says

- **lines corrupted**: shown lines with ``bench:`` in them that are not exactly one of the
  lines the labelled processes printed, plus printed lines never shown (target 0). Each
  process's own sequence must come out exactly as printed.
- **identical lines merged**: of the lines every process prints identically, the share
  shown exactly once, with the label of all processes (target 100 %).
- **delay**: during the long cell, median (and 90th percentile, maximum) of the time from
  a line's first arrival at the kernel to its display (target median <= 1 s).

The times come from the kernel side's collators (the collator class is wrapped, nothing
else changes): when each line's text arrived, and when its label was written. The same
recorded arrivals are also replayed offline through the collator with a 0.1 s window (the
old default) to show what the window buys. Other whole lines (native messages, which reach
the cell separately) are counted but are not corruption.

Usage
-----
``python bench/collation.py [--sizes 4,16] [--cells 20] [--quick]``; ``--quick`` runs 5
cells and 4 long-cell steps. 16 processes on 2 cores take several minutes.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import statistics
import sys
import time
from collections import Counter, deque
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _procs import reap  # noqa: E402

from jaxsys_kernel import Cluster  # noqa: E402
from jaxsys_kernel import cells as executor  # noqa: E402
from jaxsys_kernel._ranges import format_procs, parse_procs  # noqa: E402
from jaxsys_kernel.cells import collate  # noqa: E402

# Measured without a standby: its engines would boot alongside what is measured
# (bench/faults.py measures the standby).
os.environ.setdefault("JAXSYS_STANDBY", "0")


# Modules that build collators for a cell; whichever exists gets the recording subclass.
COLLATOR_USERS = (
    "jaxsys_kernel.cells.run",
    "jaxsys_kernel.cells.send",
)
LABELLED = re.compile(r"\[(p[0-9,\-]+)\] (.*)")
MARK = "bench:"
START_TIMEOUT = 600.0  # 16 engines importing JAX on 2 busy cores
CELL_TIMEOUT = 600.0
LONG_STEP_S = 1.5
TARGET_DELAY = 1.0
OLD_WINDOW = 0.1

SETUP = """\
import time
import numpy as np
import jax
from jax.experimental import multihost_utils as mu
from jax.sharding import NamedSharding, PartitionSpec as P
_sharding = NamedSharding(jax.make_mesh((jax.device_count(),), ("x",)), P("x"))
def _global(k):
    local = np.full((jax.local_device_count(),), jax.process_index() + k, np.float32)
    return jax.make_array_from_process_local_data(_sharding, local)
"""

CELL = """\
_s = jax.jit(lambda a: a.sum() * {m})(_global({k}))
print("bench: cell {k} n", jax.process_count())
print("bench: cell {k} sum", float(_s))
print("bench: cell {k} rank", jax.process_index())
if jax.process_index() == 0:
    print("bench: cell {k} only p0")
mu.sync_global_devices("bench-cell-{k}")
print("bench: cell {k} done")
"""

LONG = """\
for _step in range({steps}):
    _s = jax.jit(lambda a, s=_step: a.sum() + s)(_global(0))
    print("bench: long step", _step, "sum", float(_s))
    print("bench: long step", _step, "rank", jax.process_index())
    if jax.process_index() == 0:
        print("bench: long step", _step, "p0")
    time.sleep({pause})
"""


def expected_cell(k: int, n: int) -> tuple[dict[int, list[str]], list[str]]:
    """What each process of cell ``k`` prints, and which of those lines all print alike."""
    total = float((n * (n - 1) // 2 + n * k) * (k + 1))
    same = [f"bench: cell {k} n {n}", f"bench: cell {k} sum {total}", f"bench: cell {k} done"]
    lines = {}
    for r in range(n):
        own = [same[0], same[1], f"bench: cell {k} rank {r}"]
        if r == 0:
            own.append(f"bench: cell {k} only p0")
        lines[r] = [*own, same[2]]
    return lines, same


def expected_long(steps: int, n: int) -> tuple[dict[int, list[str]], list[str]]:
    """What each process of the long cell prints, and the lines all print alike."""
    base = float(n * (n - 1) // 2)
    same = [f"bench: long step {s} sum {base + s}" for s in range(steps)]
    lines: dict[int, list[str]] = {r: [] for r in range(n)}
    for s in range(steps):
        for r in range(n):
            lines[r] += [same[s], f"bench: long step {s} rank {r}"]
            if r == 0:
                lines[r].append(f"bench: long step {s} p0")
    return lines, same


class Recorder:
    """What the cell's collators were fed and what they wrote, with times."""

    def __init__(self):
        self.feeds: list[list[tuple]] = []  # per collator: (time, "feed"|"finish", proc, text)
        self.shown: list[tuple[float, str, list[float]]] = []  # (time, line, arrivals)

    def collator_class(self):
        recorder = self

        class Recording(collate.LineCollator):
            def __init__(self, procs, emit, **kw):
                self._log: list[tuple] = []
                recorder.feeds.append(self._log)
                self._arrived = {p: deque() for p in procs}
                self._buf = dict.fromkeys(procs, "")
                super().__init__(procs, self._timed(emit), **kw)

            def _timed(self, emit):
                def write(text):
                    now = time.monotonic()
                    for line in text.splitlines():
                        m = LABELLED.fullmatch(line)
                        procs = parse_procs(m.group(1)[1:], 10**6) if m else []
                        arrivals = [self._arrived[p].popleft() for p in procs if self._arrived[p]]
                        recorder.shown.append((now, line, arrivals))
                    emit(text)

                return write

            def _arrive(self, proc, text):
                buf = self._buf[proc] + text
                self._arrived[proc].extend([time.monotonic()] * buf.count("\n"))
                self._buf[proc] = buf.rsplit("\n", 1)[-1]

            def feed(self, proc, text):
                self._log.append((time.monotonic(), "feed", proc, text))
                self._arrive(proc, text)
                super().feed(proc, text)

            def finish(self, proc):
                self._log.append((time.monotonic(), "finish", proc, ""))
                if self._buf[proc]:
                    self._arrive(proc, "\n")
                super().finish(proc)

            def flush(self):
                for p, rest in self._buf.items():
                    if rest:
                        self._arrive(p, "\n")
                super().flush()

        return Recording


class Capture(executor.Sink):
    """Keeps the cell's collated text."""

    def __init__(self):
        super().__init__()
        self.text = ""

    def stdout(self, text):
        self.text += text

    stderr = stdout


def install(recorder: Recorder) -> bool:
    """Make every cell build recording collators; False if no module to patch was found."""
    patched = False
    for name in COLLATOR_USERS:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(mod, "LineCollator"):
            mod.LineCollator = recorder.collator_class()
            patched = True
    return patched


def score(text: str, lines: dict[int, list[str]], same: list[str], n: int) -> dict:
    """Corrupted and merged counts of one cell's output against what it printed."""
    got: dict[int, list[str]] = {r: [] for r in range(n)}
    corrupted, other, copies = 0, [], {s: [] for s in same}
    for line in text.splitlines():
        m = LABELLED.fullmatch(line)
        if m is None or MARK not in m.group(2):
            # Unlabelled, or a native message: corruption only if the user's text is in it.
            corrupted += MARK in line
            if MARK not in line:
                other.append(line)
            continue
        procs, body = parse_procs(m.group(1)[1:], n), m.group(2)
        if any(body not in lines[p] for p in procs):
            corrupted += 1
        for p in procs:
            got[p].append(body)
        if body in copies:
            copies[body].append(procs)
    # Printed lines never shown count too, and a process whose lines came out reordered.
    for r in range(n):
        missing = sum((Counter(lines[r]) - Counter(got[r])).values())
        corrupted += missing or (got[r] != lines[r] and sorted(got[r]) == sorted(lines[r]))
    full = list(range(n))
    merged = sum(1 for s in same if copies[s] == [full])
    splits = [
        " ".join(f"[{format_procs(ps)}]" for ps in copies[s]) for s in same if copies[s] != [full]
    ]
    return {
        "corrupted": corrupted,
        "merged": merged,
        "same": len(same),
        "other": other,
        "splits": splits,
    }


class FakeClock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def replay(feeds: list[list[tuple]], window: float) -> list[str]:
    """Run recorded feeds through a fresh collator with another window, on their own times."""
    out: list[str] = []
    for log in feeds:
        procs = sorted({p for _, _, p, _ in log})
        if not procs:
            continue
        clock = FakeClock(log[0][0])
        c = collate.LineCollator(procs, out.append, window=window, clock=clock)
        for t, kind, proc, text in log:
            while (d := c.next_deadline()) is not None and d <= t:
                clock.t = d
                c.pump()
            clock.t = t
            c.feed(proc, text) if kind == "feed" else c.finish(proc)
        c.flush()
    return out


def run_cell(cluster, code: str) -> tuple[str, Recorder, float]:
    """Run one cell on every process; its collated text, its recording, its seconds."""
    rec = Recorder()
    if not install(rec):
        raise RuntimeError(f"no collator to record in any of {', '.join(COLLATOR_USERS)}")
    sink = Capture()
    t0 = time.monotonic()
    run = executor.execute(cluster, code, sink=sink, timeout=CELL_TIMEOUT)
    executor.raise_for_run(run)
    return sink.text, rec, time.monotonic() - t0


class Tally:
    """Scores summed over the cells of one cluster size."""

    def __init__(self, n: int):
        self.n = n
        self.corrupted = self.merged = self.same = self.old_merged = 0
        self.other: list[str] = []
        self.splits: list[str] = []
        self.delays: list[float] = []
        self.spreads: list[float] = []
        self.load = [os.getloadavg()[0]]

    def add(self, text: str, rec: Recorder, lines: dict, same: list[str]) -> dict:
        s = score(text, lines, same, self.n)
        old = score("".join(replay(rec.feeds, OLD_WINDOW)), lines, same, self.n)
        self.corrupted += s["corrupted"]
        self.merged += s["merged"]
        self.same += s["same"]
        self.old_merged += old["merged"]
        self.other += s["other"]
        self.splits += s["splits"]
        self.spreads += [max(a) - min(a) for _, ln, a in rec.shown if MARK in ln and len(a) > 1]
        return s


def measure(n: int, cells: int, steps: int) -> Tally:
    """Start a cluster of ``n`` processes, run the cells and score them."""
    print(f"n={n}: starting {n} processes (load {os.getloadavg()[0]:.1f})", flush=True)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    t0 = time.monotonic()
    cluster = Cluster(
        hosts=n,
        devices_per_host=1,
        register_timeout=START_TIMEOUT,
        init_timeout=START_TIMEOUT,
        # 16 processes compiling on 2 cores can starve heartbeats; deaths are not measured.
        heartbeat_timeout=60.0,
        progress=lambda e: None,
    )
    tally = Tally(n)
    started: list[psutil.Process] = []
    try:
        cluster.start_sync()
        started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        print(f"  up in {time.monotonic() - t0:.1f} s", flush=True)
        run_cell(cluster, SETUP)
        for k in range(cells):
            text, rec, secs = run_cell(cluster, CELL.format(k=k, m=k + 1))
            s = tally.add(text, rec, *expected_cell(k, n))
            spread = max((max(a) - min(a) for _, ln, a in rec.shown if a), default=0.0)
            print(
                f"  cell {k + 1}/{cells}: {secs:.1f} s, merged {s['merged']}/{s['same']}, "
                f"corrupted {s['corrupted']}, widest arrival spread {spread * 1e3:.0f} ms",
                flush=True,
            )
        text, rec, secs = run_cell(cluster, LONG.format(steps=steps, pause=LONG_STEP_S))
        s = tally.add(text, rec, *expected_long(steps, n))
        tally.delays = [t - min(a) for t, ln, a in rec.shown if MARK in ln and a]
        print(
            f"  long cell ({steps} steps, {LONG_STEP_S:g} s apart): {secs:.1f} s, merged "
            f"{s['merged']}/{s['same']}, corrupted {s['corrupted']}",
            flush=True,
        )
        tally.load.append(os.getloadavg()[0])
        return tally
    finally:
        cluster.kill()
        left = reap(started, timeout=10)
        if left:
            print(f"  warning: {len(left)} process(es) outlived the cluster and were killed")


def report(t: Tally) -> None:
    """Print one cluster size's scores."""
    d = sorted(t.delays)
    print(f"n={t.n}  (load average {t.load[0]:.1f} at start, {t.load[-1]:.1f} at end)")
    print(f"  lines corrupted:        {t.corrupted} (target 0)")
    print(
        f"  identical lines merged: {t.merged}/{t.same} = {100 * t.merged / t.same:.0f} % "
        f"(target 100 %); the same arrivals replayed with a {OLD_WINDOW:g} s window: "
        f"{100 * t.old_merged / t.same:.0f} %"
    )
    print(
        f"  delay, first arrival to display, long cell: median {statistics.median(d):.2f} s, "
        f"p90 {d[int(0.9 * (len(d) - 1))]:.2f} s, max {d[-1]:.2f} s "
        f"(target median <= {TARGET_DELAY:g} s)"
    )
    if t.spreads:
        sp = sorted(t.spreads)
        print(
            f"  arrival spread of merged lines: median {statistics.median(sp) * 1e3:.0f} ms, "
            f"max {sp[-1] * 1e3:.0f} ms"
        )
    for split in t.splits[:5]:
        print(f"  not merged: {split}")
    if t.other:
        print(f"  {len(t.other)} other line(s) (not the cell's), e.g. {t.other[0]!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4,16", help="process counts, comma-separated")
    ap.add_argument("--cells", type=int, default=None, help="cells per size (default 20)")
    ap.add_argument("--quick", action="store_true", help="5 cells and 4 long-cell steps")
    args = ap.parse_args(argv)
    cells = args.cells or (5 if args.quick else 20)
    steps = 4 if args.quick else 8
    print(
        f"collation: {cells} cells with a first-time collective, then a {steps}-step long "
        f"cell; window {collate.DEFAULT_WINDOW:g} s; {os.cpu_count()} CPUs",
        flush=True,
    )
    tallies = [measure(int(s), cells, steps) for s in args.sizes.split(",") if s]
    print()
    for t in tallies:
        report(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
