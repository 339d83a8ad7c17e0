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
import io
import json
import math
import os
import re
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from IPython.display import display

from ..engine.hooks import PROFILE_MARK as MARK
from ..engine.registry import engine_module
from ..errors import CellError, ConfigError, JaxsysError
from . import trace_limits
from .trace_fetch import Fetched, checked_info, fetch, fetch_one, trace_infos
from .trace_limits import LIMITS, Limits, TraceRefused

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
# Where merged traces go unless the user names a directory: relative to the kernel's
# working directory, which under Jupyter is the notebook's.
DEFAULT_DIR = "jaxsys-traces"


@dataclass
class Offset:
    """A process's clock minus the kernel's, in seconds, and how well it is known."""

    seconds: float
    error: float


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
            told = calls.results.get(r)
            if not isinstance(told, int | float) or not math.isfinite(told):
                continue
            if r not in best or half < best[r].error:
                best[r] = Offset(told - (t0 + half), half)
    missing = [r for r in ranks if r not in best]
    if missing:
        raise CellError(f"processes {missing} did not tell their clock within 10 s")
    return best


def _mark_ts(rank: int, events: list[dict]) -> float:
    for e in events:
        if e.get("name") == MARK and isinstance(e.get("ts"), int | float):
            return float(e["ts"])
    raise TraceRefused(
        f"process {rank}'s trace has no start mark; was it written by the profile hook?"
    )


def _zero(trace: Fetched, offset: Offset) -> float:
    """Kernel-clock microseconds of the trace's start mark."""
    return (trace.mark_wall - offset.seconds) * 1e6


class Merger:
    """Merges traces one process at a time, each parsed only while it is merged.

    Parameters
    ----------
    origin : float
        Kernel-clock microseconds that become the merged trace's zero: the earliest start
        mark (:func:`_zero`), known before any trace is parsed.
    limits : Limits
        What each trace, and the merged file, may hold.
    """

    def __init__(self, origin: float, limits: Limits = LIMITS):
        self.origin = origin
        self.limits = limits
        self.events: list[dict] = []
        self.offsets: dict[int, Offset] = {}
        self.refused: dict[int, str] = {}

    def add(self, trace: Fetched, offset: Offset) -> bool:
        """Merge one process's trace; False (with the reason kept) if it was refused."""
        try:
            room = self.limits.events - len(self.events)
            events = trace_limits.events(trace.data, trace.rank, room, self.limits)
            mark = _mark_ts(trace.rank, events)
            shift = _zero(trace, offset) - mark - self.origin
            self.events.extend(_rank_events(trace.rank, events, shift, offset))
        except TraceRefused as e:
            self.refused[trace.rank] = str(e)
            return False
        self.offsets[trace.rank] = offset
        return True

    def result(self) -> dict:
        """The merged Perfetto JSON trace."""
        ranks = sorted(self.offsets)
        return {
            "displayTimeUnit": "ns",
            "traceEvents": self.events,
            "metadata": {
                "jaxsys": {
                    "processes": ranks,
                    "clock_offsets_s": {str(r): self.offsets[r].seconds for r in ranks},
                    "clock_errors_s": {str(r): self.offsets[r].error for r in ranks},
                    "refused": {str(r): why for r, why in sorted(self.refused.items())},
                }
            },
        }


def merge(traces: dict[int, Fetched], offsets: dict[int, Offset], limits: Limits = LIMITS) -> dict:
    """One Perfetto JSON trace: a track group per process, every time on the kernel's clock.

    Timestamps are microseconds from the earliest start mark. Traces are parsed one at a
    time, under ``limits``.

    Raises
    ------
    TraceRefused
        More traces than ``limits.files``, or a trace over a limit (the first one's reason).
    """
    trace_limits.check_files(len(traces), limits)
    merger = Merger(min(_zero(t, offsets[r]) for r, t in traces.items()), limits)
    for r in sorted(traces):
        if not merger.add(traces[r], offsets[r]):
            raise TraceRefused(merger.refused[r])
    return merger.result()


def _hashable(v) -> int | str | None:
    """A pid or tid as a dictionary key: what a trace names it by, or its text, bounded."""
    return v if v is None or isinstance(v, int | str) else str(v)[:80]


def _label(e: dict):
    """The ``args.name`` of a metadata event, if it is text."""
    args = e.get("args")
    name = args.get("name") if isinstance(args, dict) else None
    return name[:200] if isinstance(name, str) else None


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _rank_events(rank: int, events: list[dict], shift: float, offset: Offset) -> list[dict]:
    pid = rank + 1  # Perfetto treats pid 0 specially
    names, threads = {}, {}
    for e in events:
        if e.get("name") in ("process_name", "thread_name") and _label(e) is not None:
            key = (_hashable(e.get("pid")), _hashable(e.get("tid")))
            if e["name"] == "process_name":
                names[key[0]] = _label(e)
            else:
                threads[key] = _label(e)
    tids: dict[tuple, int] = {}
    label = f"p{rank} (clock {offset.seconds * 1e3:+.3f} ms ± {offset.error * 1e3:.3f} ms)"
    out = [
        {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": label}},
        {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": rank}},
    ]
    for e in events:
        # Metadata is rebuilt below; an event whose times are not numbers is left out.
        if e.get("ph") == "M" or not all(_number(e[k]) for k in ("ts", "dur") if k in e):
            continue
        key = (_hashable(e.get("pid")), _hashable(e.get("tid")))
        tid = tids.setdefault(key, len(tids) + 1)
        moved = dict(e, pid=pid, tid=tid)
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
        if not isinstance(name, str):
            continue
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


def trace_dir(directory=None) -> Path:
    """Where merged traces go: ``directory``, or ``jaxsys-traces`` in the working directory.

    Under Jupyter the kernel's working directory is the notebook's, so a trace sits next to
    the notebook it came from and outlives the cluster (whose own directory is removed at
    stop).
    """
    return Path(directory if directory is not None else DEFAULT_DIR).expanduser().absolute()


def save(merged: dict, directory, name: str) -> str:
    """Write ``merged`` as ``<directory>/<name>-<date>-<time>-<random>.trace.json.gz``.

    The random part, and creating the file only if it does not exist, keep two traces
    saved in the same second (or by two kernels) apart. Returns the path.

    Raises
    ------
    ConfigError
        The directory cannot be made or written.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        os.makedirs(directory, exist_ok=True)
        for _ in range(8):
            path = os.path.join(directory, f"{name}-{stamp}-{secrets.token_hex(3)}.trace.json.gz")
            try:
                raw = open(path, "xb")  # noqa: SIM115 - closed by the with below
            except FileExistsError:
                continue
            # The fastest compression: a trace is written once and read once, and level 9
            # takes seconds on tens of MB.
            with raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as gz:
                with io.TextIOWrapper(gz, encoding="utf-8") as f:
                    json.dump(merged, f)
            return path
    except OSError as e:
        raise ConfigError(
            f"cannot write the merged trace in {directory} ({e.strerror or e}): "
            "choose a writable directory with --profile-dir"
        ) from e
    raise ConfigError(f"no free name for a merged trace in {directory}")


def collect(cluster, ranks: Sequence[int], name: str, directory=None, limits: Limits = LIMITS):
    """Fetch, align, merge and save every process's last trace, one process at a time.

    Each process's trace directory is removed once the kernel has it (or gave up on it).
    A process whose trace breaks ``limits`` is left out, its reason kept in ``refused``.

    Returns
    -------
    dict
        ``path`` of the merged file, the view's ``summary``, the clock ``offsets``, the
        trace ``sizes`` per process (bytes, gzipped), ``refused`` (rank to reason),
        ``transfer_s`` and ``merge_s``.

    Raises
    ------
    TraceRefused
        Too many traces, or no trace could be merged.
    """
    trace_limits.check_files(len(ranks), limits)
    t0 = time.perf_counter()
    try:
        offsets = measure_offsets(cluster, ranks)
        clocks_s = time.perf_counter() - t0
        merger, sizes, fetch_s = _fetch_and_merge(cluster, ranks, offsets, limits)
        fetch_s += clocks_s
    finally:
        cluster.call(list(ranks), profiling.discard, timeout=30.0)
    if not merger.offsets:
        raise TraceRefused("no trace could be merged: " + "; ".join(merger.refused.values()))
    merged = merger.result()
    path = save(merged, trace_dir(directory), name)
    return {
        "path": path,
        "summary": summary(merged),
        "offsets": merger.offsets,
        "sizes": sizes,
        "refused": dict(merger.refused),
        "transfer_s": fetch_s,
        "merge_s": time.perf_counter() - t0 - fetch_s,
    }


def _fetch_and_merge(cluster, ranks, offsets, limits):
    """Fetch and merge one process at a time, so one parsed trace is in memory at once."""
    answers = trace_infos(cluster, ranks, strict=False)
    checked, merger = {}, Merger(0.0, limits)
    for r in ranks:
        try:
            checked[r] = checked_info(r, answers[r], limits)
        except TraceRefused as e:
            merger.refused[r] = str(e)
    zeros = [(float(i["mark_wall"]) - offsets[r].seconds) * 1e6 for r, i in checked.items()]
    merger.origin = min(zeros, default=0.0)
    sizes, fetch_s = {}, 0.0
    for r in checked:
        t0 = time.perf_counter()
        try:
            fetched = fetch_one(cluster, r, checked[r], limits=limits)
        except (TraceRefused, CellError) as e:
            merger.refused[r] = str(e)
            continue
        finally:
            fetch_s += time.perf_counter() - t0
        sizes[r] = len(fetched.data)
        merger.add(fetched, offsets[r])
        del fetched
    return merger, sizes, fetch_s


def after_cell(cluster, ranks: Sequence[int], where=True, name: str = "cell") -> dict | None:
    """Collect and show a profiled cell's timeline; say why in words if there is none.

    ``where`` is the directory for the merged trace (``True``: the default one). Nothing
    is raised: the cell's own results and errors are shown whatever happens here.
    """
    directory = None if where is True else where
    try:
        collected = collect(cluster, ranks, name, directory)
    except JaxsysError as e:
        print(f"jaxsys: no merged trace: {e}", file=sys.stderr)
        return None
    show(collected)
    return collected


def show(collected: dict) -> None:
    """Say where the merged trace is, what was left out and how well clocks agree, and
    show the view."""
    # Deferred: the widgets (anywidget, ipywidgets) take most of a second to import, and
    # the kernel imports this module at start whether or not a timeline is ever shown.
    from ..widgets.timeline import TimelineView

    for rank, why in sorted(collected.get("refused", {}).items()):
        print(f"jaxsys: p{rank} is left out of the merged trace: {why}", file=sys.stderr)
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
    "DEFAULT_DIR",
    "LIMITS",
    "Fetched",
    "Limits",
    "Merger",
    "Offset",
    "TraceRefused",
    "after_cell",
    "collect",
    "fetch",
    "fetch_one",
    "how_to_open",
    "measure_offsets",
    "merge",
    "save",
    "show",
    "summary",
    "trace_dir",
]
