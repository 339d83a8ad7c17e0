"""Where each process spends its time, and whose arrival at a collective the others waited for.

After an executable that spans processes, every process reports the same step time: the
collective inside it holds the early ones until the last arrives. What differs is *when*
each process arrived. Every process records, per dispatch, when it began the work leading
to it, how long it spent in the input pipeline and in other host code, compiling, and
(when measured) on device before the collective, and when the call returned
(:mod:`jaxsys_kernel.cells.step_records`). With each process's clock offset against the
kernel's (measured as for timelines), the analysis puts the records on one clock and, per
step and per process, computes:

- ``input``, ``host``, ``compile``, ``compute``: as recorded (``compute`` also takes the
  time after the last arrival until the call returned);
- ``wait``: time inside the collective waiting for the others (last arrival minus its own).

The process that arrived last is named when it was late by its own doing by more than the
step's noise (:data:`MIN_LATE` seconds, :data:`REL_LATE` of the step's own length, three
clock errors), with the category where it lost the most time against the others:
``start`` (it began late), ``input``, ``host``, ``compile`` or ``compute``. Its own doing
is the time from its start to its arrival against the others' median, plus a late start
only where the start is the process's: not at a cell's first step (the cell reached the
processes one after another), and at a later step only by how much later than every other
process it began (a collective releases its processes at once, but processes sharing few
cores wake in turn, and the last to wake arrives last at the next step: measured at
8 processes on 2 cores, 20 to 60 ms, with no time of their own lost).

Pure (no JAX, no clock), so every path is unit-tested with synthetic records.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .step_records import MAX_STEPS, BadStep, checked

CATEGORIES = ("start", "input", "host", "compile", "compute")
PARTS = ("input", "host", "compile", "compute", "wait")
# A lateness of its own shorter than this many seconds is noise, not a straggler.
MIN_LATE = 0.05
# ... or shorter than this share of the step's own length (the others' median time from
# their start to their end, less their wait for the last).
REL_LATE = 0.25
# Steps held while waiting for the processes that have not reported them yet.
MAX_PENDING = 1000
# Latest findings that keep their per-process parts (the rest go into the running means).
KEEP_PARTS = 50


@dataclass
class StepFinding:
    """One step: who arrived last, how late against the others' median, and why.

    ``named`` is whether the lateness was beyond the step's noise.
    """

    step: int
    last: int
    late: float
    category: str
    named: bool
    parts: dict[int, dict[str, float]] = field(default_factory=dict, repr=False)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def analyse_step(
    step: int, records: Mapping[int, dict], errors: Mapping[int, float] | None = None
) -> StepFinding:
    """The finding for one step from every process's record, already on one clock.

    Parameters
    ----------
    step : int
        The step's number.
    records : mapping of int to dict
        Per process, its checked record (:func:`step_records.checked`) with ``start``,
        ``dispatch`` and ``end`` on the kernel's clock.
    errors : mapping of int to float, optional
        Per process, how well its clock offset is known (seconds).
    """
    arrival = {r: rec["dispatch"] + rec["compile"] + rec["compute"] for r, rec in records.items()}
    last_at = max(arrival.values())
    parts = {}
    for r, rec in records.items():
        wait = last_at - arrival[r]
        after = max(0.0, rec["end"] - last_at)
        parts[r] = {
            "input": rec["input"],
            "host": rec["host"],
            "compile": rec["compile"],
            "compute": rec["compute"] + after,
            "wait": wait,
        }
    last = max(arrival, key=lambda r: (arrival[r], -r))
    others = [r for r in records if r != last]
    if not others:
        return StepFinding(step, last, 0.0, "host", False, parts)
    late = arrival[last] - _median([arrival[r] for r in others])
    excess = {c: records[last][c] - _median([records[r][c] for r in others]) for c in CATEGORIES}
    excess["start"] = _own_start(step, records, last, others)
    own = {r: arrival[r] - records[r]["start"] for r in records}
    counted = own[last] - _median([own[r] for r in others]) + excess["start"]
    length = _median([records[r]["end"] - records[r]["start"] - parts[r]["wait"] for r in others])
    worst_error = max((errors or {}).get(r, 0.0) for r in records)
    noise = max(MIN_LATE, REL_LATE * length, 3 * worst_error)
    category = max(CATEGORIES, key=lambda c: excess[c])
    return StepFinding(step, last, late, category, counted > noise, parts)


def _own_start(step: int, records: Mapping[int, dict], last: int, others: list[int]) -> float:
    """How much of the last process's late start was its own doing (seconds).

    Nothing at a cell's first step: its start is when the cell reached the process, which the
    kernel's sending and the machine's scheduling decide. At a later step a process starts
    when the previous collective released it; only a start later than every other one's
    is the process's own (processes sharing cores wake in turn, each in its own order).
    """
    if step == 0:
        return 0.0
    return max(0.0, records[last]["start"] - max(records[r]["start"] for r in others))


class Stragglers:
    """Collects step records from every process of a cell and analyses each complete step.

    Parameters
    ----------
    ranks : sequence of int
        The processes running the cell.
    offsets : mapping of int to float, optional
        Per process, its clock minus the kernel's (seconds); 0 when not given.
    errors : mapping of int to float, optional
        Per process, the offset's uncertainty (seconds).
    """

    def __init__(self, ranks, offsets=None, errors=None):
        self.ranks = sorted(ranks)
        self.offsets = dict(offsets or {})
        self.errors = dict(errors or {})
        self.pending: dict[int, dict[int, dict]] = {}
        self.findings: list[StepFinding] = []
        self.refused: dict[int, str] = {}
        self.counts: dict[int, int] = dict.fromkeys(self.ranks, 0)
        self.dropped = 0
        self._sums = {r: dict.fromkeys(PARTS, 0.0) for r in self.ranks}

    def add(self, rank: int, record) -> StepFinding | None:
        """Take one record from ``rank``; the step's finding once every process sent it."""
        if rank not in self.counts or rank in self.refused:
            return None
        try:
            rec = checked(record)
        except BadStep as e:
            self.refused[rank] = str(e)
            return None
        self.counts[rank] += 1
        if self.counts[rank] > MAX_STEPS:
            self.dropped += 1
            return None
        shift = self.offsets.get(rank, 0.0)
        for key in ("start", "dispatch", "end"):
            rec[key] -= shift
        waiting = self.pending.setdefault(rec["step"], {})
        waiting[rank] = rec
        if len(waiting) == len(self.ranks):
            del self.pending[rec["step"]]
            found = analyse_step(rec["step"], waiting, self.errors)
            self._keep(found)
            return found
        if len(self.pending) > MAX_PENDING:
            del self.pending[min(self.pending)]
            self.dropped += 1
        return None

    def _keep(self, found: StepFinding) -> None:
        for r, parts in found.parts.items():
            for p in PARTS:
                self._sums[r][p] += parts[p]
        self.findings.append(found)
        if len(self.findings) > KEEP_PARTS:
            self.findings[-KEEP_PARTS - 1].parts = {}

    def named(self, steps: int = 5) -> tuple[int, str] | None:
        """The process and category named in most of the last ``steps`` steps, if any is.

        A different process late at each step (a busy machine's scheduling) names no one.
        """
        recent = [f for f in self.findings[-steps:] if f.named]
        votes: dict[tuple[int, str], int] = {}
        for f in recent:
            votes[(f.last, f.category)] = votes.get((f.last, f.category), 0) + 1
        if not votes:
            return None
        top = max(votes, key=lambda k: (votes[k], -k[0]))
        return top if 2 * votes[top] > min(steps, len(self.findings)) else None

    def breakdown(self) -> dict[int, dict[str, float]]:
        """Per process, the mean seconds per step in each part over the analysed steps."""
        n = max(1, len(self.findings))
        return {r: {p: v / n for p, v in s.items()} for r, s in self._sums.items()}


__all__ = [
    "CATEGORIES",
    "MIN_LATE",
    "PARTS",
    "REL_LATE",
    "StepFinding",
    "Stragglers",
    "analyse_step",
]
