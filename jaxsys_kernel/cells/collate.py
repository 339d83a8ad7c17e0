"""Collation of per-process output lines: identical lines once, differing lines per process.

Streaming and de-duplication pull against each other: a line can only be shown once for all
processes after every process has printed it, and processes print the same line up to several
hundred milliseconds apart (16 processes on a busy machine). The collator holds lines back,
for at most ``window`` seconds, to find their twins.

Which lines are twins
    Lines are matched by content, not by position: a line's identity is its text and how
    many times its process printed that text before (the third ``loss nan`` of process 2 is
    the twin of the third ``loss nan`` of process 5). A line printed by one process only
    (``if rank == 0: print(...)``) therefore never shifts the lines that follow it, and the
    common lines after it still merge.

When a line is shown
    A line waits at the head of its process's queue until one of these holds, checked in
    this order:

    1. *Complete*: every other process either has it at the head of its queue too (it is in
       the group), had its copy shown in an earlier group, has finished, or holds a line
       that a member of the group printed *after* it (so it skipped it). The group is shown
       at once.
    2. *Expired*: ``window`` seconds have passed since the first process printed it. The
       group is shown with the processes that have it at their head.
    3. *Positional*: every process it could still come from has printed some other line at
       this point. As in a position-by-position collation, the differing lines are shown
       now, in process order; but when one group is larger than every other, the smaller
       ones go first and the large one waits (within its window) for their processes' next
       line, which is, most often, the same line after an extra one.
    4. *Crossed*: processes printed the same lines in different orders, so every group waits
       on another; the oldest goes first.

    Lines that differ at one point of the output come out in process order, whichever of
    them became ready first: with a complete or expired group, the groups of earlier
    processes at that point are shown just before it.

    Everything held is shown when the cell ends (:meth:`LineCollator.flush`); a process that
    has finished (:meth:`LineCollator.finish`) is never waited for. Each process's own lines
    always come out in the order it printed them.

Laggards
    When a group is shown because its window expired, processes that had not printed the
    line yet may print it later. Text already written cannot be relabelled, so their copies
    form a group of their own: they are merged with each other (waiting only for the other
    laggards, within a window of their own) and shown under the laggards' label, e.g.
    ``[p0-12] n 16`` and then ``[p13-15] n 16``. The lines that follow are matched as usual,
    so a slow process costs a second copy of the lines it was late for, never a shifted
    output. With arrival spreads below the window, the common case, every identical line
    shows exactly once.

Partial lines (no newline yet) wait for their newline until their process finishes or the
cell ends.
"""

from __future__ import annotations

import re
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import islice

from .._ranges import format_procs

# Seconds a line waits for its twins. Engines flush output every 50 ms, but a line printed
# right after a first collective reaches the kernel from 16 processes on a busy machine up to
# about 600 ms apart.
DEFAULT_WINDOW = 1.0
# How far past a group's line its members' queues are searched for evidence that another
# process skipped it; bounded so that a process with a long backlog costs little per check.
LOOKAHEAD = 16
# What a line may keep of a native message and still be only that message.
_NUMBERS_ONLY = re.compile(r"[\d\s]*")

Key = tuple[str, int]


@dataclass(frozen=True)
class _Line:
    text: str
    key: Key  # (text, how many times this process printed that text before)
    arrival: float


@dataclass
class _Group:
    """The processes whose head line has one identity, and what the group waits on."""

    key: Key
    members: list[int]
    queued: list[int] = field(default_factory=list)  # have it, behind other lines
    positional: list[int] = field(default_factory=list)  # printed something else here
    waiting: list[int] = field(default_factory=list)  # may still print it next

    @property
    def complete(self) -> bool:
        return not (self.queued or self.positional or self.waiting)


# What a process that printed nothing has shown: nothing.
_NONE: Counter[str] = Counter()


class LineCollator:
    """Merge the line streams of several processes into one labelled stream.

    Parameters
    ----------
    procs : sequence of int
        The processes whose output is collated, in display order.
    emit : callable
        Called with each finished chunk of text (one or more ``[pK] line\\n`` lines).
    window : float
        Longest time, in seconds, a line is held back waiting for the same line from the
        other processes, counted from the first process that printed it.
    collate : bool
        When False, every line is emitted at once with its own process label.
    clock : callable
        Monotonic clock, replaceable in tests.
    drop : re.Pattern, optional
        Known noise from native libraries: what it matches is cut out of every line, and a
        line with nothing else but digits (or an empty line right after one) is discarded.
    rename : callable, optional
        Applied to each complete line before it is matched, so that text naming something
        each process has its own copy of (its cell's temporary file) can collate.
    """

    def __init__(
        self,
        procs: Sequence[int],
        emit: Callable[[str], None],
        *,
        window: float = DEFAULT_WINDOW,
        collate: bool = True,
        clock: Callable[[], float] = time.monotonic,
        drop: re.Pattern | None = None,
        rename: Callable[[str], str] | None = None,
    ):
        self.procs = list(procs)
        self.rename = rename
        self.emit = emit
        self.window = window
        self.collate = collate
        self.clock = clock
        self.drop = drop
        self._partial = dict.fromkeys(self.procs, "")
        # Per process, made at its first line: at 64 processes a cell makes four
        # collators, and building every process's queue and counters up front cost 0.6 ms.
        self._lines: dict[int, deque[_Line]] = {}
        self._finished: set[int] = set()
        self._after_noise = dict.fromkeys(self.procs, False)
        # Per process: lines of each text printed, and shown; together they say whether a
        # given line identity is still queued, already shown, or not printed yet.
        self._printed: dict[int, Counter[str]] = {}
        self._shown: dict[int, Counter[str]] = {}
        # For each line identity still held: when its first copy arrived (its window's start)
        # and which processes hold a copy.
        self._first: dict[Key, float] = {}
        self._holders: dict[Key, set[int]] = {}

    # -- input ---------------------------------------------------------------------------

    def _without_noise(self, proc: int, lines: list[str]) -> list[str]:
        # Two native threads that each write a message and then its newline can interleave
        # as "AB\n\n": the noise line, then an empty one that belongs to it.
        kept = []
        for ln in lines:
            rest = self.drop.sub("", ln)
            # Digits left beside noise are its own numbers, pushed apart from their words by
            # another thread's pieces ("[Gloo] Rank 2[Gloo] Rank 3 is connected ...").
            if rest != ln and _NUMBERS_ONLY.fullmatch(rest):
                self._after_noise[proc] = True
                continue
            if self._after_noise[proc] and not ln.strip():
                self._after_noise[proc] = False
                continue
            self._after_noise[proc] = False
            # The user's own text survives noise that was written into the middle of it.
            kept.append(rest)
        return kept

    def feed(self, proc: int, text: str) -> None:
        """Add text printed by one process; complete lines become eligible for output."""
        buf = self._partial[proc] + text
        *complete, rest = buf.split("\n")
        self._partial[proc] = rest
        if self.drop is not None:
            complete = self._without_noise(proc, complete)
        if self.rename is not None:
            complete = [self.rename(ln) for ln in complete]
        if not self.collate:
            if complete:
                self.emit("".join(f"[{format_procs([proc])}] {ln}\n" for ln in complete))
            return
        self._queue(proc, complete)
        self.pump()

    def _queue(self, proc: int, lines: list[str]) -> None:
        now = self.clock()
        printed = self._printed.get(proc)
        if printed is None:
            printed = self._printed[proc] = Counter()
            self._shown[proc] = Counter()
            self._lines[proc] = deque()
        queue = self._lines[proc]
        for text in lines:
            key = (text, printed[text])
            printed[text] += 1
            queue.append(_Line(text, key, now))
            self._first.setdefault(key, now)
            self._holders.setdefault(key, set()).add(proc)

    def finish(self, proc: int) -> None:
        """Mark a process as done: its unterminated last line counts as a line."""
        if self._partial[proc]:
            self.feed(proc, "\n")
        self._finished.add(proc)
        self.pump()

    # -- state ---------------------------------------------------------------------------

    def pending(self) -> bool:
        """Whether any line is held back."""
        return any(self._lines.values())

    def next_deadline(self) -> float | None:
        """Clock time at which the oldest held line must be shown, or None.

        Only lines at the head of a queue count: a line behind them arrived later, and its
        own window ends no earlier than theirs.
        """
        starts = [self._first[q[0].key] for q in self._lines.values() if q]
        return min(starts) + self.window if starts else None

    # -- output --------------------------------------------------------------------------

    def pump(self) -> None:
        """Emit every group of lines that is ready."""
        self._drain(force=False)

    def flush(self) -> None:
        """Emit everything, partial lines included."""
        for p in self.procs:
            if self._partial[p]:
                if self.collate:
                    self._queue(p, [self._partial[p]])
                else:
                    self.emit(f"[{format_procs([p])}] {self._partial[p]}\n")
                self._partial[p] = ""
        self._drain(force=True)

    def _drain(self, force: bool) -> None:
        out: list[str] = []
        while True:
            groups = self._head_groups()
            if not groups:
                break
            chosen = self._choose(groups, force)
            if not chosen:
                break
            out.extend(self._show(g) for g in chosen)
        if out:
            self.emit("".join(out))

    def _head_groups(self) -> list[_Group]:
        """One group per distinct head line, ordered by their first process."""
        members: dict[Key, list[int]] = {}
        for p in self.procs:
            queue = self._lines.get(p)
            if queue:
                members.setdefault(queue[0].key, []).append(p)
        return [self._classify(key, ps) for key, ps in members.items()]

    def _classify(self, key: Key, members: list[int]) -> _Group:
        """Sort every other process by what it means for this group (see the module doc)."""
        text, j = key
        group = _Group(key, members)
        holders = self._holders[key]
        skipped = self._skippers(members)
        for q in self.procs:
            if q in holders:
                if self._lines[q][0].key != key:
                    group.queued.append(q)
            elif q in self._finished or q in skipped or self._shown.get(q, _NONE)[text] > j:
                continue
            elif self._lines.get(q):
                group.positional.append(q)
            else:
                group.waiting.append(q)
        return group

    def _skippers(self, members: list[int]) -> set[int]:
        """Processes holding a line that a member printed after the group's line.

        Such a process cannot also print the group's line in an order consistent with that
        member's, so waiting for it is pointless.
        """
        found: set[int] = set()
        for p in members:
            for line in islice(self._lines[p], 1, 1 + LOOKAHEAD):
                found |= self._holders[line.key]
        return found

    def _choose(self, groups: list[_Group], force: bool) -> list[_Group]:
        """The groups to show now, in order; empty when all should go on waiting."""
        complete = [g for g in groups if g.complete]
        if complete:
            return self._in_process_order(groups, complete[-1], expired=False)
        now = self.clock()
        expired = [g for g in groups if now >= self._first[g.key] + self.window]
        if expired:
            oldest = min(expired, key=lambda g: self._first[g.key])
            return self._in_process_order(groups, oldest, expired=True)
        movable = [g for g in groups if not (g.queued or g.waiting)]
        if movable:
            largest = max(len(g.members) for g in groups)
            biggest = [g for g in groups if len(g.members) == largest]
            if len(biggest) == 1:
                smaller = [g for g in movable if g is not biggest[0]]
                if smaller:
                    return smaller
            return movable
        if force or not any(g.waiting for g in groups):
            # Crossed orders, or the cell is over: nothing that arrives can unblock them.
            return [min(groups, key=lambda g: self._first[g.key])]
        return []

    @staticmethod
    def _in_process_order(groups: list[_Group], due: _Group, expired: bool) -> list[_Group]:
        """``due`` and, before it, the groups of earlier processes at the same point of the
        output, so that differing lines keep process order whichever became ready first.

        Before a complete group, those are the groups that wait only on processes which
        printed something else; before an expired one, every group not queued behind another
        line (as a position-by-position collation would show them together).
        """
        last = groups.index(due)
        early = [g for g in groups[:last] if not g.queued and (expired or not g.waiting)]
        return [*early, due]

    def _show(self, group: _Group) -> str:
        text, _ = key = group.key
        holders = self._holders[key]
        for p in group.members:
            self._lines[p].popleft()
            self._shown[p][text] += 1
            holders.discard(p)
        # Copies still queued elsewhere become a group of their own, with their own window.
        if holders:
            self._first[key] = min(
                ln.arrival for q in holders for ln in self._lines[q] if ln.key == key
            )
        else:
            del self._first[key], self._holders[key]
        return f"[{format_procs(group.members)}] {text}\n"
