"""One timeline of every process: traces fetched, clocks aligned, merged into one Perfetto file.

Each process profiles a cell with ``jax.profiler`` (the ``profile`` cell hook,
:mod:`jaxsys_kernel.engine.profiling`). Afterwards the kernel:

1. measures each process's clock against its own (:func:`measure_offsets`: the process's
   ``time.time()`` against the midpoint of the kernel's request and reply; the round with
   the shortest round trip wins, and half of it is the stated error);
2. fetches each trace in pieces over the cluster's request channel (:func:`fetch`), so no
   shared filesystem is needed;
3. merges them (:func:`merge`): each process becomes one Perfetto process (one track group,
   ``p0``, ``p1``, ...), whose threads are the original processes' threads, and every
   timestamp is moved onto the kernel's clock through the trace's start mark;
4. keeps a small summary for the view (:func:`summary`): per process, the executables and
   collectives it ran, and the cell lines they came from.

The merge and summary are pure (bytes and dicts in, dicts out) and unit-tested.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from IPython.display import display

from ..engine.hooks import PROFILE_MARK as MARK
from ..engine.registry import engine_module
from ..errors import CellError

profiling = engine_module("profiling")
# Names of the spans the view shows: executables dispatched from Python, and collectives.
_EXECUTABLE = re.compile(r"^PjitFunction\((.*)\)$")
_COLLECTIVE = re.compile(
    r"all-reduce|all-gather|all-to-all|reduce-scatter|collective-permute|"
    r"AllReduce|AllGather|gloo",
    re.IGNORECASE,
)
_CELL_LINE = re.compile(r"^\$.*ipykernel_\d+[/\\]\d+\.py:(\d+) ")
# Most spans per process kept in the view's summary (the longest ones).
VIEW_SPANS = 400


@dataclass
class Offset:
    """A process's clock minus the kernel's, in seconds, and how well it is known."""

    seconds: float
    error: float


@dataclass
class Fetched:
    """One process's trace as fetched: the gzipped Perfetto JSON and its start mark."""

    rank: int
    data: bytes
    mark_wall: float
    seconds: float = 0.0
    pieces: int = 0
    extra: dict = field(default_factory=dict)


def measure_offsets(cluster, ranks: Sequence[int], rounds: int = 5) -> dict[int, Offset]:
    """Each process's clock offset against the kernel's (best of ``rounds`` round trips).

    One process at a time: asking all at once would make every round trip as long as the
    slowest answer, and the error is half the round trip.
    """
    best: dict[int, Offset] = {}
    for r in ranks:
        for _ in range(rounds):
            t0 = time.time()
            calls = cluster.call([r], profiling.clock, timeout=10.0)
            t1 = time.time()
            half = (t1 - t0) / 2
            if r in calls.results and (r not in best or half < best[r].error):
                best[r] = Offset(calls.results[r] - (t0 + half), half)
    missing = [r for r in ranks if r not in best]
    if missing:
        raise CellError(f"processes {missing} did not tell their clock within 10 s")
    return best


def fetch(cluster, ranks: Sequence[int], timeout: float = 120.0) -> dict[int, Fetched]:
    """Bring every process's last trace to the kernel, in pieces over ``Cluster.call``.

    Raises
    ------
    CellError
        A process has no trace (the cell was not profiled there) or did not send it.
    """
    infos = cluster.call(list(ranks), profiling.trace_info, timeout=30.0)
    out = {}
    for r in ranks:
        info = infos.results.get(r)
        if info is None:
            why = infos.errors.get(r, "no trace: the cell was not profiled there")
            raise CellError(f"process {r} sent no trace ({why})")
        t0, chunks, offset = time.perf_counter(), [], 0
        while offset < info["size"]:
            calls = cluster.call([r], profiling.read_trace, offset, info["chunk"], timeout=timeout)
            if r not in calls.results:
                raise CellError(f"process {r} did not send its trace ({calls.errors.get(r)})")
            piece = calls.results[r]
            if not piece:
                break
            chunks.append(piece)
            offset += len(piece)
        out[r] = Fetched(
            r, b"".join(chunks), info["mark_wall"], time.perf_counter() - t0, len(chunks)
        )
    return out


def _events(data: bytes) -> list[dict]:
    raw = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    loaded = json.loads(raw)
    return loaded["traceEvents"] if isinstance(loaded, dict) else loaded


def _mark_ts(events: list[dict]) -> float:
    for e in events:
        if e.get("name") == MARK and "ts" in e:
            return float(e["ts"])
    raise CellError("a trace has no start mark; was it written by the profile hook?")


def merge(traces: dict[int, Fetched], offsets: dict[int, Offset]) -> dict:
    """One Perfetto JSON trace: a track group per process, every time on the kernel's clock.

    Timestamps are microseconds from the earliest start mark.
    """
    per_rank = {r: _events(t.data) for r, t in traces.items()}
    # Kernel-clock microseconds of each trace's zero.
    zero = {
        r: (traces[r].mark_wall - offsets[r].seconds) * 1e6 - _mark_ts(ev)
        for r, ev in per_rank.items()
    }
    origin = min(zero[r] + _mark_ts(ev) for r, ev in per_rank.items())
    merged: list[dict] = []
    for r in sorted(per_rank):
        merged.extend(_rank_events(r, per_rank[r], zero[r] - origin, offsets[r]))
    return {
        "displayTimeUnit": "ns",
        "traceEvents": merged,
        "metadata": {
            "jaxsys": {
                "processes": sorted(per_rank),
                "clock_offsets_s": {str(r): offsets[r].seconds for r in per_rank},
                "clock_errors_s": {str(r): offsets[r].error for r in per_rank},
            }
        },
    }


def _rank_events(rank: int, events: list[dict], shift: float, offset: Offset) -> list[dict]:
    pid = rank + 1  # Perfetto treats pid 0 specially
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    threads = {
        (e["pid"], e.get("tid")): e["args"]["name"]
        for e in events
        if e.get("name") == "thread_name"
    }
    tids: dict[tuple, int] = {}

    def tid_of(e: dict) -> int:
        key = (e.get("pid"), e.get("tid"))
        if key not in tids:
            tids[key] = len(tids) + 1
        return tids[key]

    label = f"p{rank} (clock {offset.seconds * 1e3:+.3f} ms ± {offset.error * 1e3:.3f} ms)"
    out = [
        {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": label}},
        {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": rank}},
    ]
    for e in events:
        if e.get("ph") == "M":
            continue
        moved = dict(e, pid=pid, tid=tid_of(e))
        if "ts" in e:
            moved["ts"] = round(float(e["ts"]) + shift, 3)
        out.append(moved)
    for key, tid in tids.items():
        thread = threads.get(key, f"thread {key[1]}")
        name = f"{names.get(key[0], key[0])} / {thread}"
        out.append(
            {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}}
        )
    return out


def summary(merged: dict, limit: int = VIEW_SPANS) -> dict:
    """What the timeline view draws: per process, executables, collectives and cell lines."""
    rows: dict[int, list] = {}
    end = 0.0
    for e in merged["traceEvents"]:
        if e.get("ph") != "X" or "ts" not in e:
            continue
        name = e.get("name", "")
        m = _EXECUTABLE.match(name)
        line = _CELL_LINE.match(name)
        if m:
            kind, text = "executable", m.group(1)
        elif _COLLECTIVE.search(name) and not name.startswith("$"):
            kind, text = "collective", name
        elif line:
            kind, text = "line", f"line {line.group(1)}"
        else:
            continue
        span = {"kind": kind, "name": text, "start": e["ts"], "dur": float(e.get("dur", 0.0))}
        rows.setdefault(e["pid"] - 1, []).append(span)
        end = max(end, e["ts"] + span["dur"])
    processes = []
    for rank in sorted(rows):
        spans = sorted(rows[rank], key=lambda s: -s["dur"])[:limit]
        busy = sum(s["dur"] for s in spans if s["kind"] == "executable")
        processes.append(
            {"rank": rank, "spans": sorted(spans, key=lambda s: s["start"]), "executable_us": busy}
        )
    meta = merged.get("metadata", {}).get("jaxsys", {})
    return {
        "kind": "timeline",
        "end_us": end,
        "processes": processes,
        "clock_errors_s": meta.get("clock_errors_s", {}),
    }


def save(merged: dict, directory, name: str) -> str:
    """Write ``merged`` as ``<directory>/<name>.trace.json.gz``; returns the path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.trace.json.gz")
    # The fastest compression: a trace is written once and read once, and level 9 takes
    # seconds on tens of MB.
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
        json.dump(merged, f)
    return path


def traces_dir(cluster) -> Path:
    """Where merged traces are kept: ``traces/`` in the cluster's own directory."""
    return Path(cluster.connection_file).parents[1] / "traces"


def collect(cluster, ranks: Sequence[int], name: str) -> dict:
    """Fetch, align, merge and save every process's last trace.

    Returns
    -------
    dict
        ``path`` of the merged file, the view's ``summary``, the clock ``offsets``, the
        trace ``sizes`` per process (bytes, gzipped), ``transfer_s`` and ``merge_s``.
    """
    t0 = time.perf_counter()
    offsets = measure_offsets(cluster, ranks)
    fetched = fetch(cluster, ranks)
    t1 = time.perf_counter()
    merged = merge(fetched, offsets)
    path = save(merged, traces_dir(cluster), name)
    t2 = time.perf_counter()
    return {
        "path": path,
        "summary": summary(merged),
        "offsets": offsets,
        "sizes": {r: len(f.data) for r, f in fetched.items()},
        "transfer_s": t1 - t0,
        "merge_s": t2 - t1,
    }


def show(collected: dict) -> None:
    """Say where the merged trace is and how well clocks agree, and show the view."""
    # Deferred: the widgets (anywidget, ipywidgets) take most of a second to import, and
    # the kernel imports this module at start whether or not a timeline is ever shown.
    from ..widgets.timeline import TimelineView

    worst = max(o.error for o in collected["offsets"].values())
    print(how_to_open(collected["path"]))
    print(f"clocks aligned to the kernel's within {worst * 1e3:.3f} ms")
    display(TimelineView(collected["summary"]))


def how_to_open(path: str) -> str:
    """One sentence on opening a merged trace."""
    return (
        f"merged trace: {path} (open it at https://ui.perfetto.dev with 'Open trace file', "
        "or in xprof's trace viewer; one track group per process)"
    )


__all__ = [
    "Fetched",
    "Offset",
    "collect",
    "fetch",
    "how_to_open",
    "measure_offsets",
    "merge",
    "save",
    "show",
    "summary",
    "traces_dir",
]
