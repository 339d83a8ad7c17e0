"""The divergence check's kernel side: compare what each process dispatches, as it arrives.

Every process reports, in order, the executables it runs that span processes (see
:mod:`jaxsys_kernel.engine.divergence`), and where its cell's thread is. Executables over
the same processes must be issued by all of them in the same order, so the check keeps one
sequence per process and per group of processes, and names the first difference:

- two processes' k-th entries differ (another function, shape or sharding);
- a process finished the cell without the entry the others have;
- a process sits idle in Python (not inside JAX) for :data:`WINDOW` seconds after the
  others reached an entry it has not: it is stuck, not diverged.

Pure and clock-driven (the clock is given), so every path is unit-tested with a fake clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .._ranges import format_procs
from .divergence_records import MAX_ENTRIES, BadRecord, checked

# Seconds a process may sit idle in Python without an entry the others have.
WINDOW = 1.0
# Seconds a difference waits to learn whether the processes finish anyway (then their
# result is wrong) or wait for each other.
SETTLE = 0.5


def entry_key(entry: dict) -> tuple:
    """What two processes' entries must share: the function, its argument types, shardings."""
    return (entry.get("name"), tuple(entry.get("args", ())), tuple(entry.get("shardings", ())))


def call_text(entry: dict) -> str:
    """``f(f32[8], f32[8])`` for an entry."""
    return f"{entry.get('name', '?')}({', '.join(entry.get('args', ()))})"


def _at(entry: dict) -> str:
    line = entry.get("line")
    return f" at line {line}" if line is not None else ""


@dataclass
class _Process:
    entries: dict[tuple, list[dict]] = field(default_factory=dict)
    where: dict | None = None
    finished: bool = False
    failed: bool = False
    count: int = 0


@dataclass
class Finding:
    """What the check found: the sentence, its kind, and when it was found."""

    kind: str  # "diverged", "skipped" or "stuck"
    message: str
    at: float
    ranks: tuple[int, ...] = ()


class DivergenceCheck:
    """Compares the processes' dispatch sequences for one cell.

    Parameters
    ----------
    ranks : sequence of int
        The processes running the cell.
    clock : callable
        Monotonic clock (seconds).
    window : float
        Seconds a process may sit idle in Python without an entry the others have.
    settle : float
        Seconds a difference waits to learn whether the processes finish anyway.
    known : set, optional
        Entries (:func:`entry_key`) seen in earlier cells. They are left out: a process that
        ran one before may take it from JAX's cache, unseen, while a newly started process
        compiles and reports it, so its presence on some processes only is no evidence.
    """

    def __init__(
        self,
        ranks: Sequence[int],
        clock: Callable[[], float],
        window: float = WINDOW,
        settle: float = SETTLE,
        known: set | None = None,
    ):
        self.ranks = list(ranks)
        self.clock = clock
        self.window = window
        self.settle = settle
        self.known = known if known is not None else set()
        self.seen: set = set()
        self.procs = {r: _Process() for r in self.ranks}
        # group -> position -> first arrival time
        self._first: dict[tuple, dict[int, float]] = {}
        self._pending: tuple[float, dict, list] | None = None
        self.finding: Finding | None = None
        # Processes whose records were refused, and why: left out of the check.
        self.refused: dict[int, str] = {}

    # -- events ---------------------------------------------------------------------------

    def feed(self, rank: int, record) -> str | None:
        """Take one record (``dispatch`` or ``where``) from process ``rank``.

        Returns
        -------
        str or None
            Why the record was refused, the first time a process sends one that is
            malformed or over a bound (:mod:`.divergence_records`); that process is left
            out of the check for the rest of the cell, and the others go on.
        """
        proc = self.procs.get(rank)
        if proc is None or rank in self.refused:
            return None
        try:
            record = checked(record)
            if record["kind"] == "dispatch":
                proc.count += 1
                if proc.count > MAX_ENTRIES:
                    raise BadRecord(f"more than {MAX_ENTRIES:,} dispatch records in one cell")
        except BadRecord as e:
            self.refused[rank] = str(e)
            return (
                f"p{rank} sent a divergence record the kernel refuses ({e}); "
                f"p{rank} is left out of the divergence check for this cell"
            )
        if record["kind"] == "where":
            proc.where = record
            return None
        if record["kind"] != "dispatch":
            return None
        group = tuple(sorted({r for r in record["procs"] if r in self.procs}))
        key = entry_key(record)
        self.seen.add(key)
        if len(group) < 2 or key in self.known:
            return None
        seq = proc.entries.setdefault(group, [])
        self._first.setdefault(group, {}).setdefault(len(seq), self.clock())
        seq.append({**record, "_at": self.clock()})
        return None

    def _judged(self, group: tuple) -> list[int]:
        """The processes of ``group`` the check still judges (not refused)."""
        return [r for r in group if r not in self.refused]

    def finished(self, rank: int, failed: bool = False) -> None:
        """Process ``rank`` finished the cell; ``failed`` if it raised or died.

        A process that failed is the hang doctor's to explain ("p1 failed and p0 kept
        running"), so it is never said to have skipped what it did not reach.
        """
        if rank in self.procs:
            self.procs[rank].finished = True
            self.procs[rank].failed = failed

    # -- judging --------------------------------------------------------------------------

    def poll(self) -> Finding | None:
        """The finding, once there is one (it never changes afterwards)."""
        if self.finding is not None:
            return self.finding
        if self._pending is None:
            for group in self._first:
                if self._compare(group) is not None or self._pending is not None:
                    break
        if self._pending is not None:
            self._settle()
        return self.finding

    def next_deadline(self) -> float | None:
        """When :meth:`poll` may next change its answer without a new event."""
        if self.finding is not None:
            return None
        times = []
        if self._pending is not None:
            times.append(self._pending[0] + self.settle)
        for first in self._first.values():
            times.extend(t + d for t in first.values() for d in (self.settle, self.window))
        future = [t for t in times if t > self.clock()]
        return min(future) if future else None

    def _compare(self, key: tuple) -> Finding | None:
        # ``key`` names the group as its records did; refused processes are not judged.
        group = self._judged(key)
        if len(group) < 2:
            return None
        seqs = {r: self.procs[r].entries.get(key, []) for r in group}
        longest = max(len(s) for s in seqs.values())
        for k in range(longest):
            have = {r: s[k] for r, s in seqs.items() if len(s) > k}
            by_key: dict[tuple, list[int]] = {}
            for r, e in have.items():
                by_key.setdefault(entry_key(e), []).append(r)
            if len(by_key) > 1:
                since = max(e["_at"] for e in have.values())
                self._pending = (since, key, k)
                return None
            missing = [r for r in group if r not in have]
            if not missing:
                continue
            entry, ran = next(iter(have.values())), sorted(have)
            if any(self.procs[r].failed for r in missing):
                return None
            done = [r for r in missing if self.procs[r].finished]
            if done and all(self.procs[r].finished for r in group):
                # Nobody waited, so it was no collective they missed: most likely a
                # process took the call from JAX's cache, where it cannot be seen.
                return None
            if done:
                late = len(done) < len(missing)
                if late and self.clock() - self._first[key][k] < self.settle:
                    return None  # the others may still report it: name them all at once
                waiting = [r for r in group if r not in done]
                return self._found(
                    "skipped",
                    f"{format_procs(done)} finished the cell without running {call_text(entry)}"
                    f" that {format_procs(ran)} ran{_at(entry)}: "
                    f"{format_procs(waiting)} will wait for {format_procs(done)}",
                    done,
                )
            stuck = self._stuck(missing, self._first[key][k])
            if stuck:
                return self._found("stuck", self._stuck_text(stuck, entry, ran), stuck)
            return None
        return None

    def _stuck(self, missing: list[int], since: float) -> list[int]:
        if self.clock() - since < self.window:
            return []
        out = []
        for r in missing:
            w = self.procs[r].where
            if w is not None and w.get("idle") and not w.get("in_jax"):
                out.append(r)
        return out

    def _stuck_text(self, stuck: list[int], entry: dict, ran: list[int]) -> str:
        lines = {self.procs[r].where.get("line") for r in stuck}
        where = f" at line {lines.pop()}" if len(lines) == 1 and None not in lines else ""
        # One process sits and waits; several sit and wait.
        sits, is_ = ("sits", "is") if len(stuck) == 1 else ("sit", "are")
        wait = "waits" if len(ran) == 1 else "wait"
        return (
            f"{format_procs(stuck)} {sits} idle in Python{where}, not in JAX, while "
            f"{format_procs(ran)} {wait} in {call_text(entry)}{_at(entry)}: "
            f"{format_procs(stuck)} {is_} stuck, not diverged"
        )

    def _settle(self) -> None:
        since, key, k = self._pending
        group = self._judged(key)
        all_done = all(self.procs[r].finished for r in group)
        if not all_done and self.clock() - since < self.settle:
            return
        # Grouped now, not when the difference appeared: late reporters join their group.
        have = {r: seq[k] for r in group if len(seq := self.procs[r].entries.get(key, [])) > k}
        by_key: dict[tuple, list[int]] = {}
        for r, e in have.items():
            by_key.setdefault(entry_key(e), []).append(r)
        groups = sorted(by_key.values(), key=lambda g: (-len(g), g[0]))
        if len(groups) < 2:
            # The process that differed was refused meanwhile: nothing left to name.
            self._pending = None
            return
        main, others = groups[0], groups[1:]
        base = have[main[0]]
        parts = []
        for g in others:
            e = have[g[0]]
            parts.append(
                f"{format_procs(sorted(g))} ran {call_text(e)}{_at(e)} where "
                f"{format_procs(sorted(main))} ran {call_text(base)}{_at(base)}"
            )
        why = (
            "they finished, so the result is not what either computed"
            if all_done
            else "these processes will wait for each other"
        )
        odd = sorted(r for g in others for r in g)
        self._found("diverged", "; ".join(parts) + f": {why}", odd)

    def _found(self, kind: str, message: str, ranks: Sequence[int]) -> Finding:
        self.finding = Finding(kind, message, self.clock(), tuple(ranks))
        return self.finding


class DivergenceWatch:
    """Takes the divergence records out of a cell's events and shows the finding once.

    Parameters
    ----------
    check : DivergenceCheck
    say : callable
        ``say(text)``: shows one line under the cell (the sink's stderr).
    mime : str
        The mime type of the records in ``display_data`` messages.
    """

    def __init__(self, check: DivergenceCheck, say: Callable[[str], None], mime: str):
        self.check = check
        self.say = say
        self.mime = mime
        self.told: Finding | None = None

    def intercept(self, rank: int, kind: str, payload) -> bool:
        """True when the event was a divergence record (then nothing else must see it)."""
        if kind != "iopub" or payload["header"]["msg_type"] != "display_data":
            return False
        data = payload["content"].get("data")
        record = data.get(self.mime) if isinstance(data, dict) else None
        if record is None:
            return False
        refused = self.check.feed(rank, record)
        if refused is not None:
            self.say(f"jaxsys: {refused}\n")
        return True

    def tick(self, running: set[int], failed: Sequence[int] = ()) -> None:
        """Tell the check who has finished (and who of them failed); show a new finding."""
        for r in self.check.ranks:
            if r not in running and not self.check.procs[r].finished:
                self.check.finished(r, failed=r in failed)
        found = self.check.poll()
        if found is not None and self.told is None:
            self.told = found
            self.say(f"jaxsys: {found.message}\n")

    def deadline(self) -> float | None:
        """When :meth:`tick` must run next without an event."""
        return self.check.next_deadline()


__all__ = [
    "SETTLE",
    "WINDOW",
    "DivergenceCheck",
    "DivergenceWatch",
    "Finding",
    "call_text",
    "entry_key",
]
