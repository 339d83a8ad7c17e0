"""Collation of per-process output lines: identical lines once, differing lines per process.

Streaming and de-duplication pull against each other: a line can only be shown once for all
processes after every process has printed it. The collator holds each process's k-th line
until every process still running has produced its own k-th line, or until a short window
has passed since the first of them arrived; then it prints the group, merging identical
lines under one process label.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Sequence

from .._ranges import format_procs

# Engines flush output every 50 ms (engine/bootstrap.py); twice that covers the skew.
DEFAULT_WINDOW = 0.1


class LineCollator:
    """Merge the line streams of several processes into one labelled stream.

    Parameters
    ----------
    procs : sequence of int
        The processes whose output is collated, in display order.
    emit : callable
        Called with each finished chunk of text (one or more ``[pK] line\\n`` lines).
    window : float
        Seconds a line may wait for the same line from the other processes.
    collate : bool
        When False, every line is emitted at once with its own process label.
    clock : callable
        Monotonic clock, replaceable in tests.
    drop : re.Pattern, optional
        Known noise from native libraries: what it matches is cut out of every line, and a
        line with nothing else (or an empty line right after one) is discarded.
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
    ):
        self.procs = list(procs)
        self.emit = emit
        self.window = window
        self.collate = collate
        self.clock = clock
        self.drop = drop
        self._partial = dict.fromkeys(self.procs, "")
        self._lines: dict[int, deque[tuple[str, float]]] = {p: deque() for p in self.procs}
        self._finished: set[int] = set()
        self._after_noise = dict.fromkeys(self.procs, False)

    def _without_noise(self, proc: int, lines: list[str]) -> list[str]:
        # Two native threads that each write a message and then its newline can interleave
        # as "AB\n\n": the noise line, then an empty one that belongs to it.
        kept = []
        for ln in lines:
            rest = self.drop.sub("", ln)
            if rest != ln and not rest.strip():
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
        now = self.clock()
        if not self.collate:
            if complete:
                self.emit("".join(f"[{format_procs([proc])}] {ln}\n" for ln in complete))
            return
        self._lines[proc].extend((ln, now) for ln in complete)
        self.pump()

    def finish(self, proc: int) -> None:
        """Mark a process as done: its unterminated last line counts as a line."""
        if self._partial[proc]:
            self.feed(proc, "\n")
        self._finished.add(proc)
        self.pump()

    def pending(self) -> bool:
        """Whether any line is held back."""
        return any(self._lines.values())

    def next_deadline(self) -> float | None:
        """Clock time at which the oldest held line must be shown, or None."""
        times = [q[0][1] for q in self._lines.values() if q]
        return min(times) + self.window if times else None

    def pump(self) -> None:
        """Emit every group of lines that is ready."""
        out: list[str] = []
        while True:
            heads = {p: q[0][0] for p, q in self._lines.items() if q}
            if not heads:
                break
            waiting_on = [p for p in self.procs if p not in heads and p not in self._finished]
            if waiting_on:
                oldest = min(q[0][1] for q in self._lines.values() if q)
                if self.clock() - oldest < self.window:
                    break
            out.append(self._group(heads))
        if out:
            self.emit("".join(out))

    def flush(self) -> None:
        """Emit everything, partial lines included."""
        for p in self.procs:
            if self._partial[p]:
                if self.collate:
                    self._lines[p].append((self._partial[p], self.clock()))
                else:
                    self.emit(f"[{format_procs([p])}] {self._partial[p]}\n")
                self._partial[p] = ""
        out = []
        while any(self._lines.values()):
            out.append(self._group({p: q[0][0] for p, q in self._lines.items() if q}))
        if out:
            self.emit("".join(out))

    def _group(self, heads: dict[int, str]) -> str:
        by_text: dict[str, list[int]] = {}
        for p in self.procs:
            if p in heads:
                by_text.setdefault(heads[p], []).append(p)
                self._lines[p].popleft()
        return "".join(f"[{format_procs(ps)}] {text}\n" for text, ps in by_text.items())
