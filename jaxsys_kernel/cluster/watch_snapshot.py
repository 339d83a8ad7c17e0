"""The owner's live numbers for watchers: a small JSON file beside the cluster's state file.

Only the owner of a cluster receives its processes' telemetry (compilation-cache hits and
misses) and can ask them for their step records. ``jaxsys cluster start`` writes what it
knows every :data:`PERIOD` seconds to ``NAME.live`` in its state directory (readable by its
user only, replaced atomically, never larger than :data:`MAX_SNAPSHOT_BYTES`), so that a
watcher can show it without sending the cluster a message.

A watcher reads the file as untrusted input: at most :data:`MAX_SNAPSHOT_BYTES`, then every
field checked and cut to size; whatever fails is said in words (:attr:`Live.problem`) and
the rest of the status is shown as before. A file older than :data:`STALE_AFTER` seconds
means its owner stopped writing: the watcher says so and how old the numbers are.

Standard library only, as :mod:`.watch`.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .._ranges import format_procs
from ..errors import ProtocolError

#: Seconds between two snapshots the owner writes.
PERIOD = 2.0
#: A snapshot older than this many seconds is stale: its owner stopped writing.
STALE_AFTER = 10.0
#: A larger file is refused unread (the owner's own snapshots stay far below it).
MAX_SNAPSHOT_BYTES = 256 * 1024
#: Processes listed one by one in a snapshot; a larger world keeps only the sums.
MAX_ROWS = 1024
#: Latest steps a snapshot carries.
MAX_STEPS = 8
#: Characters kept of any text field.
MAX_TEXT = 200
#: Fields of a process's cache numbers, all counts (non-negative integers).
CACHE_FIELDS = ("rank", "requests", "hits", "compiles", "shared")
VERSION = 1


def snapshot_path(directory: str | os.PathLike, name: str) -> Path:
    """Where the owner of cluster ``name`` writes its live numbers (``NAME.live``: never a
    state file, which ends in ``.json``)."""
    return Path(directory) / f"{name}.live"


def write(path: Path, snapshot: dict) -> bool:
    """Replace ``path`` with ``snapshot`` atomically, readable by this user only.

    A snapshot over :data:`MAX_SNAPSHOT_BYTES` is written without its per-process rows
    (then, should it still be too large, not at all). Returns whether it was written.
    """
    data = json.dumps(snapshot, separators=(",", ":")).encode()
    if len(data) > MAX_SNAPSHOT_BYTES:
        snapshot = {**snapshot, "cache": None, "stragglers": None, "note": "too large to show"}
        data = json.dumps(snapshot, separators=(",", ":")).encode()
        if len(data) > MAX_SNAPSHOT_BYTES:
            return False
    part = path.with_name(f".{path.name}.part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(part, path)
    return True


@dataclass
class Live:
    """What a watcher shows of the owner's live numbers.

    ``cache`` holds per process ``rank, requests, hits, compiles, shared`` (None: the owner
    has no telemetry); ``stragglers`` the checked straggler summary (None: none yet);
    ``note`` the owner's word on the step records; ``age`` the snapshot's age in seconds;
    ``problem`` why nothing could be shown ('' when all is well).
    """

    cache: list[dict] | None = None
    stragglers: dict | None = None
    note: str = ""
    age: float | None = None
    problem: str = ""


class Bad(ProtocolError):
    """A snapshot field that is not what the owner writes."""


def _count(d: dict, key: str) -> int:
    v = d.get(key)
    if type(v) is not int or v < 0:
        raise Bad(f"{key} is not a count")
    return v


def _seconds(d: dict, key: str) -> float:
    v = d.get(key)
    if type(v) not in (int, float) or not math.isfinite(v):
        raise Bad(f"{key} is not a number of seconds")
    return float(v)


def _text(v) -> str:
    if not isinstance(v, str):
        raise Bad("a text field is not text")
    return v[:MAX_TEXT]


def _cache(rows) -> list[dict] | None:
    if rows is None:
        return None
    if not isinstance(rows, list) or len(rows) > MAX_ROWS:
        raise Bad(f"cache is not a list of at most {MAX_ROWS} processes")
    out = []
    for row in rows:
        if not isinstance(row, dict):
            raise Bad("a cache row is not an object")
        out.append({k: _count(row, k) for k in CACHE_FIELDS})
    return out


def _step(s) -> dict:
    if not isinstance(s, dict) or type(s.get("named")) is not bool:
        raise Bad("a step is not an object with named true or false")
    return {
        "step": _count(s, "step"),
        "last": _count(s, "last"),
        "late": _seconds(s, "late"),
        "category": _text(s.get("category"))[:16],
        "named": s["named"],
    }


def _stragglers(summary) -> dict | None:
    if summary is None:
        return None
    if not isinstance(summary, dict):
        raise Bad("stragglers is not an object")
    steps = summary.get("steps")
    if not isinstance(steps, list) or len(steps) > MAX_STEPS:
        raise Bad(f"stragglers' steps is not a list of at most {MAX_STEPS}")
    named = summary.get("named")
    if named is not None:
        if not isinstance(named, dict):
            raise Bad("the straggler named is not an object")
        named = {"rank": _count(named, "rank"), "category": _text(named.get("category"))[:16]}
    return {
        "steps_total": _count(summary, "steps_total"),
        "step_time": _seconds(summary, "step_time"),
        "named": named,
        "steps": [_step(s) for s in steps],
    }


def parse(data: bytes, now: float) -> Live:
    """The checked content of a snapshot's bytes; never raises."""
    if len(data) > MAX_SNAPSHOT_BYTES:
        return Live(problem=f"larger than {MAX_SNAPSHOT_BYTES} bytes: not one the owner wrote")
    try:
        raw = json.loads(data)
    except ValueError:
        return Live(problem="not JSON (half written, or not the owner's)")
    if not isinstance(raw, dict) or raw.get("v") != VERSION:
        return Live(problem=f"not a version-{VERSION} snapshot of the owner's")
    try:
        written = _seconds(raw, "written")
        return Live(
            cache=_cache(raw.get("cache")),
            stragglers=_stragglers(raw.get("stragglers")),
            note=_text(raw.get("note", "")),
            age=max(0.0, now - written),
        )
    except Bad as e:
        return Live(problem=f"unreadable: {e}")


def read(path: Path, now: float | None = None) -> Live | None:
    """The owner's live numbers at ``path``, checked (None: the owner writes none)."""
    now = time.time() if now is None else now
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SNAPSHOT_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        return Live(problem=f"cannot be read ({e.strerror})")
    return parse(data, now)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def cache_lines(cache: list[dict]) -> list[str]:
    """Compilation-cache hits and misses, one line per set of processes with equal numbers."""
    groups: dict[tuple, list[int]] = {}
    for row in cache:
        misses = max(0, row["requests"] - row["hits"])
        key = (row["hits"], misses, row["compiles"])
        groups.setdefault(key, []).append(row["rank"])
    total_hits = sum(r["hits"] for r in cache)
    total_misses = sum(max(0, r["requests"] - r["hits"]) for r in cache)
    lines = [f"cache (live, from the owner): {total_hits} hits, {total_misses} misses in all"]
    for (hits, misses, compiles), ranks in sorted(groups.items(), key=lambda kv: kv[1][0]):
        lines.append(f"  [{format_procs(ranks)}] hits {hits}, misses {misses}, compiled {compiles}")
    return lines


def step_lines(summary: dict | None, note: str) -> list[str]:
    """The last steps of the owner's latest cell and the straggler named, or why none."""
    if summary is None or not summary["steps_total"]:
        return [f"steps: {note or 'none recorded yet'}"]
    named = summary["named"]
    who = f"p{named['rank']} ({named['category']})" if named else "none"
    lines = [
        f"steps (the owner's latest recorded): {summary['steps_total']} steps, "
        f"{_ms(summary['step_time'])} each on average; straggler: {who}"
        + (f"; {note}" if note else "")
    ]
    for s in summary["steps"]:
        late = f"p{s['last']} last by {_ms(s['late'])}"
        lines.append(f"  step {s['step']}: {late}" + (f" ({s['category']})" if s["named"] else ""))
    return lines


def describe(live: Live | None, owner_alive: bool) -> list[str]:
    """The lines a watcher's status shows of the owner's live numbers."""
    if live is None:
        why = "it publishes none" if owner_alive else "the owner is gone"
        return [f"live numbers: none ({why})"]
    if live.problem:
        return [f"live numbers: the owner's snapshot is {live.problem}; not shown"]
    lines = []
    if live.age is not None and (live.age > STALE_AFTER or not owner_alive):
        lines.append(
            f"live numbers: stale, written {live.age:.0f} s ago (the owner stopped writing "
            "them); as they were then:"
        )
    if live.cache is None:
        lines.append("cache (live): none (the owner runs without telemetry)")
    else:
        lines += cache_lines(live.cache)
    return lines + step_lines(live.stragglers, live.note)


__all__ = [
    "MAX_ROWS",
    "MAX_SNAPSHOT_BYTES",
    "MAX_STEPS",
    "PERIOD",
    "STALE_AFTER",
    "Live",
    "describe",
    "parse",
    "read",
    "snapshot_path",
    "write",
]
