"""A training run as the program printed it: step and loss per process, faults, goodput.

The program prints ``step N loss L`` (and ``restored step N`` after reading a checkpoint);
jaxsys shows every process's lines labelled with the processes that printed them
(``[p0-1] step 3 loss 2.1234``). :class:`TrainingLog` reads that shown text, timed as it
is shown, so the chart needs no logging of its own: what the reader saw is what is drawn.

A ``%%multihost --retries`` cell adds what the kernel knows about each fault
(:meth:`TrainingLog.failed`, :meth:`TrainingLog.restarted`, :meth:`TrainingLog.attempt`).
A fault's recovery is timed from the last step shown before it (the last sign of progress:
the kernel cannot see the instant a process died) to the failure being known, the world's
restart, the program's restore and its first step after it.

The lines come from the processes, so they are untrusted: a line longer than
:data:`MAX_LINE` is ignored, at most :data:`MAX_POINTS` points and :data:`MAX_FAULTS` faults
are kept, and a label naming a process at or past :data:`MAX_PROCS` is ignored.
"""

from __future__ import annotations

import bisect
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .._ranges import parse_procs

MAX_LINE = 400
MAX_POINTS = 20_000
MAX_FAULTS = 100
MAX_PROCS = 4096

_LABEL = r"\[p(?P<procs>[0-9,\-]{1,200})\] "
STEP_LINE = re.compile(_LABEL + r"step (?P<step>\d{1,9}) loss (?P<loss>[-+0-9.eEnaifNAIF]{1,32})")
RESTORED_LINE = re.compile(_LABEL + r"restored step (?P<step>\d{1,9})\s*$")


@dataclass
class Recovery:
    """One fault and the times of its recovery, in seconds on the kernel's clock.

    Attributes
    ----------
    what : str
        What happened, as ``--retries`` says it (``process 1 died (SIGKILL)``).
    kind : str
        ``dead`` or ``stuck``.
    who : list of int
        The processes that died or were named stuck.
    fault, detected, restarted : float
        The last step shown before the fault, the failure known, the world restarted.
    restored, first_good : float or None
        The program's ``restored step`` line and its first step after the retry.
    restored_step : int or None
        The step it restored.
    """

    what: str
    kind: str
    who: list[int]
    fault: float
    detected: float
    restarted: float | None = None
    restored: float | None = None
    first_good: float | None = None
    restored_step: int | None = None

    def phases_ms(self) -> list[tuple[str, float | None]]:
        """``(phase, ms after the fault)`` for detected, restarted, restored, first good step."""
        marks = [
            ("detected", self.detected),
            ("world restarted", self.restarted),
            ("restored", self.restored),
            ("first good step", self.first_good),
        ]
        return [(name, None if t is None else (t - self.fault) * 1e3) for name, t in marks]


@dataclass
class TrainingLog:
    """Step, loss and time per process from shown output, with the faults of a run.

    Parameters
    ----------
    clock : callable
        The time of a line (seconds), read when it is fed.
    """

    clock: Callable[[], float] = time.monotonic
    start: float = 0.0
    end: float | None = None
    points: dict[int, list[tuple[float, int, float]]] = field(default_factory=dict)
    attempts: list[float] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    dropped: int = 0
    _partial: str = ""
    _count: int = 0

    def __post_init__(self):
        self.start = self.clock()
        self.attempts.append(self.start)

    # -- what was shown ---------------------------------------------------------------

    def feed(self, text: str) -> bool:
        """Read shown text (any chunks); True if it added a point."""
        now = self.clock()
        buf = self._partial + text
        *lines, rest = buf.split("\n")
        self._partial = rest if len(rest) <= MAX_LINE else ""
        added = False
        for line in lines:
            if len(line) <= MAX_LINE:
                added |= self._line(line.rstrip("\r"), now)
        return added

    def _line(self, line: str, now: float) -> bool:
        m = STEP_LINE.match(line)
        if m is not None:
            procs = _procs(m["procs"])
            try:
                loss = float(m["loss"])
            except ValueError:
                return False
            return self._add(procs, now, int(m["step"]), loss)
        m = RESTORED_LINE.match(line)
        last = self._retrying()
        if m is not None and _procs(m["procs"]) and last is not None and last.restored is None:
            last.restored, last.restored_step = now, int(m["step"])
        return False

    def _retrying(self) -> Recovery | None:
        """The latest fault, once the cell has been sent again after it."""
        if self.recoveries and len(self.attempts) > len(self.recoveries):
            return self.recoveries[-1]
        return None

    def _add(self, procs: list[int], now: float, step: int, loss: float) -> bool:
        if not procs:
            return False
        if self._count + len(procs) > MAX_POINTS:
            self.dropped += len(procs)
            return False
        self._count += len(procs)
        for p in procs:
            self.points.setdefault(p, []).append((now, step, loss))
        last = self._retrying()
        if last is not None and last.first_good is None:
            last.first_good = now
        return True

    # -- what the kernel knows ----------------------------------------------------------

    def failed(self, what: str, kind: str, who: list[int]) -> None:
        """The cell failed now, curably: ``kind`` (dead or stuck) of processes ``who``."""
        if len(self.recoveries) >= MAX_FAULTS:
            return
        now = self.clock()
        shown = [t for pts in self.points.values() for t, _, _ in pts if t >= self.attempts[-1]]
        fault = max(shown, default=self.attempts[-1])
        self.recoveries.append(Recovery(what, kind, list(who)[:MAX_PROCS], fault, now))

    def restarted(self) -> None:
        """The world has restarted after the latest fault."""
        if self.recoveries and self.recoveries[-1].restarted is None:
            self.recoveries[-1].restarted = self.clock()

    def attempt(self) -> None:
        """The cell is sent again."""
        if len(self.attempts) <= MAX_FAULTS:
            self.attempts.append(self.clock())

    def finish(self) -> None:
        """The cell has ended (well or not)."""
        self.end = self.clock()

    # -- what it adds up to -------------------------------------------------------------

    def has_steps(self) -> bool:
        """Whether any step was shown."""
        return bool(self.points)

    def _timeline(self) -> list[tuple[int, float, int]]:
        """``(attempt, time, step)`` of each step as first shown by any process."""
        firsts: dict[tuple[int, int], float] = {}
        for pts in self.points.values():
            for t, step, _ in pts:
                key = (bisect.bisect_right(self.attempts, t) - 1, step)
                firsts[key] = min(t, firsts.get(key, t))
        return sorted((a, t, step) for (a, step), t in firsts.items())

    def goodput(self) -> tuple[float, float, int]:
        """``(productive s, wall s, steps recomputed)``.

        A step is productive when its result was kept (no later attempt did it again); its
        time is from the step before it in the same attempt, so an attempt's first step,
        which carries its start-up and compiling, counts as lost, as do outages and steps
        done again after a restore.
        """
        line = self._timeline()
        wall = (self.end if self.end is not None else self.clock()) - self.start
        # The lowest step any later attempt did: this attempt's steps from there were redone.
        later: dict[int, float] = {}
        low = math.inf
        for a, _, step in reversed(line):
            later.setdefault(a, low)
            low = min(low, step)
        productive, recomputed = 0.0, 0
        for i, (a, t, step) in enumerate(line):
            redone = step >= later[a]
            recomputed += redone
            before = line[i - 1] if i else None
            if not redone and before is not None and before[0] == a and before[2] < step:
                productive += t - before[1]
        return productive, max(wall, 0.0), recomputed

    def outages(self) -> list[tuple[float, float]]:
        """``(from, to)`` of each fault: its last step shown to its first good step (or the
        end, or now)."""
        end = self.end if self.end is not None else self.clock()
        return [(r.fault, end if r.first_good is None else r.first_good) for r in self.recoveries]

    def last(self) -> tuple[int, float] | None:
        """The last step shown and its loss (any process)."""
        latest = max((pt for pts in self.points.values() for pt in pts), default=None)
        return None if latest is None else (latest[1], latest[2])


def _procs(label: str) -> list[int]:
    try:
        return parse_procs(label, MAX_PROCS)
    except ValueError:
        return []


__all__ = ["MAX_FAULTS", "MAX_LINE", "MAX_POINTS", "MAX_PROCS", "Recovery", "TrainingLog"]
