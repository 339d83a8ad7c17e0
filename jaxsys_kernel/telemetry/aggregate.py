"""Views of many processes that stay the same size however many there are.

Up to :data:`ROWS_UP_TO` processes a front end gets one row per process. Above that it
gets a summary (counts by state, at most :data:`MAX_GROUPS` groups of consecutive ranks,
and the distinct errors with the ranks that share each) and the rows of the one group it
asked to open. :class:`RowDeltas` turns successive rows into versioned changes keyed by
rank, so that a steady cluster costs a few bytes per update rather than every row again;
:class:`RowFeed` adds what changes every update anyway (heartbeat ages) for the rows shown
and the summary only when it changed: the message both the comm and the views send.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from .._ranges import format_procs
from ..errors import ProtocolError
from ..protocol import ProcessState

#: Processes up to which every row is sent.
ROWS_UP_TO = 64
#: Most groups a summary holds: their size grows with the cluster instead of their number.
MAX_GROUPS = 32
#: Most distinct errors a summary lists (the most widespread first).
MAX_ERRORS = 8
#: Fields of a row whose change is worth sending (heartbeat ages change every second).
STABLE_FIELDS = ("rank", "host", "pid", "devices", "state", "busy", "error")
#: Fields that change on every update; a :class:`RowFeed` sends them apart, for shown rows.
VOLATILE_FIELDS = ("heartbeat_age",)
#: Below this many seconds a group's oldest heartbeat counts as 0 (fresh): a 1 Hz beat
#: sampled at any moment is 0-1.x s old, and the summary should not change with that.
FRESH_SECONDS = 2

# How alarming a state is, for a group's worst member.
_SEVERITY = {
    ProcessState.ALIVE: 0,
    ProcessState.STARTING: 1,
    ProcessState.RESTARTING: 2,
    ProcessState.UNKNOWN: 3,
    ProcessState.STUCK: 4,
    ProcessState.DEAD: 5,
}


def group_size(nprocs: int) -> int:
    """Ranks per group for a cluster of ``nprocs`` (one group per rank up to MAX_GROUPS)."""
    return max(1, math.ceil(nprocs / MAX_GROUPS))


def group_of(rank: int, nprocs: int) -> int:
    """The group holding ``rank``."""
    return rank // group_size(nprocs)


def group_rows(rows: list[dict], group: int, nprocs: int) -> list[dict]:
    """The rows of one group (``rows`` in rank order, one per rank)."""
    size = group_size(nprocs)
    return rows[group * size : (group + 1) * size]


def _group(index: int, rows: list[dict]) -> dict:
    states: dict[str, int] = {}
    for r in rows:
        states[r["state"]] = states.get(r["state"], 0) + 1
    ages = [r["heartbeat_age"] for r in rows if r.get("heartbeat_age") is not None]
    hosts = sorted({r.get("host") for r in rows if r.get("host")})
    return {
        "group": index,
        "ranks": format_procs([r["rank"] for r in rows], prefix=""),
        "hosts": hosts[0] if len(hosts) == 1 else f"{len(hosts)} hosts" if hosts else "",
        "states": states,
        "worst": max(states, key=lambda s: _SEVERITY.get(s, 3)),
        "busy": sum(1 for r in rows if r.get("busy")),
        # Whole seconds, 0 while fresh: the summary changes when a process falls behind,
        # not with every beat.
        "oldest_heartbeat": _late_seconds(max(ages)) if ages else None,
    }


def _late_seconds(age: float) -> int:
    whole = math.floor(age)
    return whole if whole >= FRESH_SECONDS else 0


def _errors(rows: Iterable[dict]) -> list[dict]:
    by_text: dict[str, list[int]] = {}
    for r in rows:
        if r.get("error"):
            by_text.setdefault(r["error"], []).append(r["rank"])
    shared = sorted(by_text.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    return [
        {"error": text, "count": len(ranks), "ranks": format_procs(ranks, prefix="")}
        for text, ranks in shared[:MAX_ERRORS]
    ] + (
        [{"error": f"{len(shared) - MAX_ERRORS} more distinct errors", "count": 0, "ranks": ""}]
        if len(shared) > MAX_ERRORS
        else []
    )


def summarize(rows: list[dict]) -> dict:
    """The summary of a cluster's rows: by state, by group of ranks, by the same error.

    Parameters
    ----------
    rows : list of dict
        One row per process in rank order: ``rank``, ``host``, ``state``, ``busy``,
        ``heartbeat_age`` and, optionally, ``error`` (why it died or failed).

    Returns
    -------
    dict
        ``by_state`` (state -> count), ``group_size``, ``groups`` (at most
        :data:`MAX_GROUPS`: ``group``, ``ranks``, ``hosts``, ``states``, ``worst``,
        ``busy``, ``oldest_heartbeat``) and ``errors`` (at most :data:`MAX_ERRORS` + 1).
    """
    by_state: dict[str, int] = {}
    for r in rows:
        by_state[r["state"]] = by_state.get(r["state"], 0) + 1
    size = group_size(len(rows))
    groups = [_group(i // size, rows[i : i + size]) for i in range(0, len(rows), size)]
    return {"by_state": by_state, "group_size": size, "groups": groups, "errors": _errors(rows)}


class RowDeltas:
    """Versioned changes of per-rank rows: what changed since the version a reader holds.

    Only ``fields`` count as a change (by default :data:`STABLE_FIELDS`; None: every field
    but :data:`VOLATILE_FIELDS`). A reader that holds version ``v`` applies ``changes(v)``
    when its ``base`` is ``v``, and asks for everything again otherwise.
    """

    def __init__(self, fields: tuple[str, ...] | None = STABLE_FIELDS) -> None:
        self.version = 0
        self.fields = fields
        self._rows: dict[int, dict] = {}
        self._changed_at: dict[int, int] = {}

    def _key(self, row: dict) -> dict:
        if self.fields is None:
            return {k: v for k, v in row.items() if k not in VOLATILE_FIELDS}
        return {k: row.get(k) for k in self.fields}

    def update(self, rows: Iterable[dict]) -> int:
        """Take the current rows; returns the version after them."""
        seen = set()
        bumped = False
        for row in rows:
            key = self._key(row)
            rank = key["rank"]
            seen.add(rank)
            if self._rows.get(rank) != key:
                if not bumped:
                    self.version, bumped = self.version + 1, True
                self._rows[rank] = key
                self._changed_at[rank] = self.version
        for rank in set(self._rows) - seen:
            if not bumped:
                self.version, bumped = self.version + 1, True
            del self._rows[rank]
            self._changed_at[rank] = self.version
        return self.version

    def changes(self, since: int) -> dict:
        """``{"v", "base", "rows", "gone"}``: rows changed after version ``since``, keyed by
        rank, and ranks that left; ``base`` is ``since`` (0 gives everything)."""
        rows = {
            r: self._rows[r] for r, at in self._changed_at.items() if at > since and r in self._rows
        }
        gone = [r for r, at in self._changed_at.items() if at > since and r not in self._rows]
        if since <= 0:
            gone = []
        return {"v": self.version, "base": since, "rows": rows, "gone": sorted(gone)}


def _age(value: float | None) -> float | None:
    # Tenths of a second are all a reader sees, and they keep the message short.
    return None if value is None else round(value, 1)


class RowFeed:
    """What a front end that holds version ``v`` of some rows needs next, in one message.

    :meth:`update` takes the rows shown now (every row, or one group's) and returns
    ``{"v", "base", "rows", "gone", "ages"}``: the rows whose fields other than the
    heartbeat age changed since the last update (keyed by rank), the ranks no longer shown,
    and the current age of every row shown (``ages``, keyed by rank), which is what changes
    every second. The message is bounded by the rows shown, never by the cluster.

    Parameters
    ----------
    fields : tuple of str, optional
        As for :class:`RowDeltas` (default: every field but the age).
    ages : bool
        Send ``ages`` (rows without a heartbeat age, such as cache numbers, need none).
    """

    def __init__(self, fields: tuple[str, ...] | None = None, ages: bool = True) -> None:
        self.deltas = RowDeltas(fields)
        self.sent = 0
        self._ages = ages

    @property
    def version(self) -> int:
        """The version of the rows after the last update."""
        return self.deltas.version

    def update(self, rows: list[dict]) -> dict:
        """The message for the rows shown now, from the version of the previous update."""
        self.deltas.update(rows)
        out = self.deltas.changes(self.sent)
        self.sent = self.deltas.version
        if self._ages:
            out["ages"] = {r["rank"]: _age(r.get("heartbeat_age")) for r in rows}
        return out


def apply_rows(held: dict[int, dict], message: dict) -> dict[int, dict]:
    """Apply a :class:`RowFeed` message to the rows a reader holds (keyed by rank).

    The reader's side of the protocol, in Python (the front ends do the same): tests use it
    to check that applied deltas give the rows the kernel has.
    """
    out = {int(r): dict(row) for r, row in held.items()}
    for r in message.get("gone", []):
        out.pop(int(r), None)
    for r, row in message.get("rows", {}).items():
        out[int(r)] = {**out.get(int(r), {}), **row}
    for r, age in message.get("ages", {}).items():
        if int(r) in out:
            out[int(r)]["heartbeat_age"] = age
    return out


def apply_delta(state: dict, message: dict) -> dict:
    """The state a front end holds after a ``delta`` message (the reader's side, in Python).

    Parameters
    ----------
    state : dict
        The state held (from a ``state`` message and the deltas after it).
    message : dict
        A ``delta`` message.

    Raises
    ------
    ProtocolError
        When the delta applies to another version than the one held (a front end then
        sends ``refresh``).
    """
    rows = message["rows"]
    held = state.get("_version", 0)
    if rows["base"] != held:
        raise ProtocolError(f"a delta from version {rows['base']} on version {held}")
    out = {**message["state"], "_version": rows["v"]}
    before = state.get("cluster") or {}
    if out.get("cluster") is None:
        return out
    by_rank = {p["rank"]: p for p in before.get("processes", [])}
    by_rank = apply_rows(by_rank, rows)
    summary = message["summary"] if "summary" in message else before.get("summary")
    out["cluster"] = {
        **out["cluster"],
        "processes": [by_rank[r] for r in sorted(by_rank)],
        "summary": summary,
    }
    return out


def held_state(message: dict) -> dict:
    """The state a front end holds after a ``state`` message (its version as ``_version``)."""
    return {**message["state"], "_version": message.get("version", 0)}
