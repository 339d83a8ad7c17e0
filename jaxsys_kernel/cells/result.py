"""What one ``%%multihost`` cell produced, and the errors it ends in."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .._ranges import format_procs
from ..contract import SUMMARY_MIME
from ..errors import CellError
from .sink import Sink

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Engines number their cells independently, so "Cell In[7]" on one is "Cell In[9]" on another.
_CELL_NUMBER = re.compile(r"In\[\d+\]")
# How long processes get to report after an interrupt or a timeout before the cell ends.
INTERRUPT_GRACE = 3.0
FAILED = ("error", "dead")


def strip_ansi(text: str) -> str:
    """Remove terminal colour codes."""
    return _ANSI.sub("", text)


def traceback_lines(tb) -> list[str]:
    """A traceback as a list of lines, whether it came as a list or as one string.

    ipyparallel's ``RemoteError.traceback`` is a single string; the kernel protocol's
    ``error`` messages carry a list.
    """
    if not tb:
        return []
    if isinstance(tb, str):
        return tb.splitlines()
    return [str(line) for line in tb]


@dataclass
class ProcResult:
    """Outcome of a cell on one process.

    Attributes
    ----------
    rank : int
        The process.
    status : str
        ``ok``, ``error``, ``dead`` (its engine went away) or ``running`` (had not finished
        when the cell ended).
    error : dict or None
        ``ename``, ``evalue`` and ``traceback`` (list of str) of the exception it raised.
    result : dict or None
        The mime bundle of the cell's value, when it ended in an expression.
    """

    rank: int
    status: str = "running"
    error: dict | None = None
    result: dict | None = None


@dataclass
class CellRun:
    """Everything one ``%%multihost`` execution produced, in process order."""

    procs: list[int]
    results: dict[int, ProcResult] = field(default_factory=dict)
    interrupted: list[int] = field(default_factory=list)
    timed_out: bool = False
    seconds: float = 0.0
    # Set when the cell was judged hung: why ("timeout", "failure" or "divergence"), which
    # processes were still running then, and what was done ("report", "interrupt", ...).
    hang: str | None = None
    stuck: list[int] = field(default_factory=list)
    hang_action: str | None = None

    def by_status(self, status: str) -> list[int]:
        """Ranks whose result has the given status."""
        return [r for r in self.procs if self.results[r].status == status]

    def failed(self) -> list[int]:
        """Ranks that raised or lost their engine."""
        return [r for r in self.procs if self.results[r].status in FAILED]


class MultihostError(CellError):
    """One or more processes raised; tracebacks are grouped when identical.

    Attributes
    ----------
    run : CellRun
        What every process did.
    """

    def __init__(self, run: CellRun, summary: str):
        super().__init__(summary)
        self.run = run

    def _render_traceback_(self) -> list[str]:
        return render_errors(self.run) + [str(self)]


class MultihostInterrupt(KeyboardInterrupt):
    """The cell was interrupted; the message names the processes that were signalled."""

    def __init__(self, run: CellRun, summary: str):
        super().__init__(summary)
        self.run = run

    def _render_traceback_(self) -> list[str]:
        return render_errors(self.run, include_interrupts=False) + [f"KeyboardInterrupt: {self}"]


class MultihostTimeout(MultihostError):
    """The cell passed its ``--timeout``; the message says which processes were still running."""


class MultihostHang(MultihostError):
    """Some processes failed while the others kept running past the grace period."""


def group_errors(run: CellRun) -> list[tuple[list[int], dict]]:
    """Group processes whose tracebacks are identical once colours are removed.

    Returns
    -------
    list of (ranks, error)
        One entry per distinct traceback, in order of the lowest rank.
    """
    groups: dict[str, tuple[list[int], dict]] = {}
    for r in run.procs:
        err = run.results[r].error
        if err is None:
            continue
        text = "\n".join(traceback_lines(err.get("traceback")))
        key = _CELL_NUMBER.sub("In[]", strip_ansi(text)) or (
            f"{err.get('ename')}: {err.get('evalue')}"
        )
        groups.setdefault(key, ([], err))[0].append(r)
    return list(groups.values())


def render_errors(run: CellRun, include_interrupts: bool = True) -> list[str]:
    """Traceback lines for a cell's errors, one block per distinct traceback."""
    lines: list[str] = []
    for ranks, err in group_errors(run):
        if not include_interrupts and err.get("ename") == "KeyboardInterrupt":
            continue
        lines.append(f"[{format_procs(ranks)}] {err.get('ename')}: {err.get('evalue')}")
        lines.extend(traceback_lines(err.get("traceback")))
        lines.append("")
    return lines


def _kinds(run: CellRun) -> str:
    return ", ".join(
        f"{err.get('ename')} on {format_procs(ranks)}" for ranks, err in group_errors(run)
    )


def interrupt_summary(run: CellRun) -> str:
    """One line naming the interrupted processes and the state of the others."""
    parts = []
    if run.interrupted:
        parts.append(f"interrupted processes {format_procs(run.interrupted)}")
    else:
        parts.append("interrupted; no process was still running")
    done = run.by_status("ok")
    if done:
        parts.append(f"finished: {format_procs(done)}")
    still = run.by_status("running")
    if still:
        parts.append(f"did not stop within {INTERRUPT_GRACE:g} s: {format_procs(still)}")
    return "; ".join(parts)


def _divergence_message(run: CellRun) -> str:
    stuck, finished = format_procs(run.stuck), format_procs(run.by_status("ok"))
    done = "interrupted" if run.hang_action == "interrupt" else "stopped"
    return (
        f"{stuck} waited inside JAX (a collective) that {finished} never entered: the program "
        f"took different paths on different processes; {stuck} were {done}"
    )


def _failure_message(run: CellRun) -> str:
    done = {"interrupt": "interrupted", "restart": "stopped by a world restart"}.get(
        run.hang_action or "", "left running"
    )
    unstopped = run.by_status("running")
    if run.hang_action == "interrupt" and unstopped:
        done += f", but {format_procs(unstopped)} did not stop within {INTERRUPT_GRACE:g} s"
    return (
        f"{_kinds(run)}; {format_procs(run.stuck)} kept running (waiting for the failed "
        f"process, most likely in a collective) and were {done}"
    )


def _timeout_message(run: CellRun) -> str:
    still = format_procs(run.stuck) if run.stuck else "none"
    msg = f"cell timed out after {run.seconds:.1f} s; still running: {still}"
    finished = run.by_status("ok")
    if finished:
        msg += f"; finished: {format_procs(finished)}"
    return msg


def raise_for_run(run: CellRun) -> None:
    """Raise :class:`MultihostError` (or a subclass) if any process failed or the cell hung.

    Parameters
    ----------
    run : CellRun
        The outcome of :func:`jaxsys_kernel.cells.execute`.

    Raises
    ------
    MultihostHang
        The cell was judged hung: a divergence, or a failure the others waited for.
    MultihostTimeout
        The cell passed its timeout.
    MultihostError
        Some processes raised (or lost their engine).
    """
    if run.hang == "divergence":
        raise MultihostHang(run, _divergence_message(run))
    if run.hang == "failure":
        raise MultihostHang(run, _failure_message(run))
    if run.timed_out:
        raise MultihostTimeout(run, _timeout_message(run))
    failed = run.failed()
    if failed:
        raise MultihostError(
            run, f"{len(failed)} of {len(run.procs)} processes failed: {_kinds(run)}"
        )


class CellResult:
    """The value a ``%%multihost`` cell ended in, as shown by the kernel.

    Identical values across processes show once; differing ones are listed per process.
    Only mime bundles travel: the engines' objects never reach the kernel.
    """

    def __init__(self, bundles: dict[int, dict]):
        self.bundles = bundles

    def _repr_mimebundle_(self, include=None, exclude=None):
        texts = {r: b.get("text/plain", "") for r, b in self.bundles.items()}
        if len(set(texts.values())) == 1:
            return next(iter(self.bundles.values()))
        groups: dict[str, list[int]] = {}
        for r, t in texts.items():
            groups.setdefault(t, []).append(r)
        return {"text/plain": "\n".join(f"[{format_procs(rs)}] {t}" for t, rs in groups.items())}

    def __repr__(self) -> str:
        return self._repr_mimebundle_()["text/plain"]


def cell_result(run: CellRun, sink: Sink | None = None) -> CellResult | None:
    """The cell's value for the kernel to display, or None if it had none.

    When the value is a mesh, a sharding or an array, its view is shown first (once, from
    the first process's summary) and the value's text follows as the cell's result.
    """
    bundles = {r: dict(run.results[r].result) for r in run.procs if run.results[r].result}
    if not bundles:
        return None
    summaries = [b.pop(SUMMARY_MIME) for b in bundles.values() if SUMMARY_MIME in b]
    if summaries:
        (sink or Sink()).view(summaries[0])
    return CellResult(bundles)
