"""Views of many processes that stay the same size however many there are.

Up to :data:`ROWS_UP_TO` processes a front end gets one row per process. Above that it
gets a summary (counts by state, at most :data:`MAX_GROUPS` groups of consecutive ranks,
and the distinct errors with the ranks that share each) and the rows of the one group it
asked to open. :class:`RowDeltas` turns successive rows into versioned changes keyed by
rank, so that a steady cluster costs a few bytes per update rather than every row again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from .._ranges import format_procs
from ..protocol import ProcessState

#: Processes up to which every row is sent.
ROWS_UP_TO = 64
#: Most groups a summary holds: their size grows with the cluster instead of their number.
MAX_GROUPS = 32
#: Most distinct errors a summary lists (the most widespread first).
MAX_ERRORS = 8
#: Fields of a row whose change is worth sending (heartbeat ages change every second).
STABLE_FIELDS = ("rank", "host", "pid", "devices", "state", "busy", "error")

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
    hosts = sorted({r["host"] for r in rows if r["host"]})
    return {
        "group": index,
        "ranks": format_procs([r["rank"] for r in rows], prefix=""),
        "hosts": hosts[0] if len(hosts) == 1 else f"{len(hosts)} hosts" if hosts else "",
        "states": states,
        "worst": max(states, key=lambda s: _SEVERITY.get(s, 3)),
        "busy": sum(1 for r in rows if r.get("busy")),
        # Whole seconds: the summary changes when a process falls behind, not every beat.
        "oldest_heartbeat": math.floor(max(ages)) if ages else None,
    }


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

    Only :data:`STABLE_FIELDS` count as a change. A reader that holds version ``v`` applies
    ``changes(v)`` when its ``base`` is ``v``, and asks for everything again otherwise.
    """

    def __init__(self) -> None:
        self.version = 0
        self._rows: dict[int, dict] = {}
        self._changed_at: dict[int, int] = {}

    def update(self, rows: Iterable[dict]) -> int:
        """Take the current rows; returns the version after them."""
        seen = set()
        bumped = False
        for row in rows:
            key = {k: row.get(k) for k in STABLE_FIELDS}
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
        return {"v": self.version, "base": since, "rows": rows, "gone": sorted(gone)}
