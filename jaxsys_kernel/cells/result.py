"""What one ``%%multihost`` cell produced, and the errors it ends in."""

from __future__ import annotations

from dataclasses import dataclass, field

from IPython import get_ipython

from .._ranges import format_procs
from ..contract import SUMMARY_MIME
from ..errors import CellError
from . import grouping
from .sink import Sink

# How long processes get to report after an interrupt or a timeout before the cell ends.
INTERRUPT_GRACE = 3.0
FAILED = ("error", "dead")


strip_ansi = grouping.strip_ansi


def traceback_lines(tb) -> list[str]:
    """A traceback as a list of lines, whether it came as a list or as one string.

    ipyparallel's ``RemoteError.traceback`` is a single string; the kernel protocol's
    ``error`` messages carry a list.
    """
    return grouping.lines_of(tb)


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


def notebook_cell_number() -> int | None:
    """The number the notebook shows for the cell running now, or None outside IPython."""
    shell = get_ipython()
    count = getattr(shell, "execution_count", None) if shell is not None else None
    # IPython counts a cell before running it (ExecutionResult.execution_count is the old
    # value): while the cell runs, the shell's counter already names the next one.
    return count - 1 if isinstance(count, int) else None


class MultihostError(CellError):
    """One or more processes raised; tracebacks are grouped when identical.

    Attributes
    ----------
    run : CellRun
        What every process did.
    """

    #: After a hang report, show the interrupted processes' tracebacks in full
    #: (``%%multihost --verbose``).
    verbose = False

    def __init__(self, run: CellRun, summary: str):
        super().__init__(summary)
        self.run = run
        self.cell_number = notebook_cell_number()

    def _render_traceback_(self) -> list[str]:
        lines = render_errors(self.run, cell_number=self.cell_number, verbose=self.verbose)
        # Named, as Python names an exception: MultihostHang is what the reader looks for.
        return lines + [f"{type(self).__name__}: {self}"]


class MultihostInterrupt(KeyboardInterrupt):
    """The cell was interrupted; the message names the processes that were signalled."""

    verbose = False

    def __init__(self, run: CellRun, summary: str):
        super().__init__(summary)
        self.run = run
        self.cell_number = notebook_cell_number()

    def _render_traceback_(self) -> list[str]:
        lines = render_errors(
            self.run, include_interrupts=False, cell_number=self.cell_number, verbose=self.verbose
        )
        return lines + [f"KeyboardInterrupt: {self}"]


class MultihostTimeout(MultihostError):
    """The cell passed its ``--timeout``; the message says which processes were still running."""


class MultihostHang(MultihostError):
    """Some processes failed while the others kept running past the grace period."""


def _errors(run: CellRun, ranks=None) -> dict[int, dict]:
    return {
        r: run.results[r].error
        for r in run.procs
        if run.results[r].error is not None and (ranks is None or r in ranks)
    }


def group_errors(run: CellRun) -> list[tuple[list[int], dict]]:
    """Group processes whose errors differ at most in their message's numbers.

    Returns
    -------
    list of (ranks, error)
        One entry per distinct error, in order of the lowest rank (see
        :func:`jaxsys_kernel.cells.grouping.group`).
    """
    return [(g.ranks, g.error) for g in grouping.group(_errors(run))]


def render_errors(
    run: CellRun,
    include_interrupts: bool = True,
    *,
    cell_number: int | None = None,
    verbose: bool = False,
) -> list[str]:
    """Traceback lines for a cell's errors, one block per group of processes.

    Parameters
    ----------
    run : CellRun
        The cell's outcome.
    include_interrupts : bool
        Show ``KeyboardInterrupt`` errors (the stop button's are left out: the message
        says who was interrupted).
    cell_number : int, optional
        The notebook's number of the cell, for the running cell's frames.
    verbose : bool
        After a hang report, show the interrupted processes' tracebacks in full rather
        than one line each.
    """
    folded = set(run.stuck) if run.hang and not verbose else set()
    lines: list[str] = []
    for g in grouping.group(_errors(run, set(run.procs) - folded)):
        if not include_interrupts and g.ename == "KeyboardInterrupt":
            continue
        lines += [*grouping.render_group(g, cell_number), ""]
    stuck = grouping.group(_errors(run, folded))
    for g in stuck:
        lines.append(grouping.folded(g))
    if stuck:
        lines += ["  (%%multihost --verbose shows these tracebacks in full)", ""]
    return lines


def _kinds(run: CellRun, ranks=None) -> str:
    by_name: dict[str, list[int]] = {}
    for g in grouping.group(_errors(run, ranks)):
        by_name.setdefault(g.ename, []).extend(g.ranks)
    return ", ".join(f"{name} on {format_procs(rs)}" for name, rs in by_name.items())


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
        f"{_kinds(run, set(run.procs) - set(run.stuck))}; {format_procs(run.stuck)} kept "
        f"running (waiting for the failed process, most likely in a collective) and "
        f"{'was' if len(run.stuck) == 1 else 'were'} {done}"
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
        # A bundle comes from an engine: a text that is not text is shown as what it is.
        texts = {r: _text(b.get("text/plain", "")) for r, b in self.bundles.items()}
        if len(set(texts.values())) == 1:
            return next(iter(self.bundles.values()))
        groups: dict[str, list[int]] = {}
        for r, t in texts.items():
            groups.setdefault(t, []).append(r)
        return {"text/plain": "\n".join(f"[{format_procs(rs)}] {t}" for t, rs in groups.items())}

    def __repr__(self) -> str:
        return self._repr_mimebundle_()["text/plain"]


def _text(value) -> str:
    return value if isinstance(value, str) else f"<{type(value).__name__} sent as text>"


def cell_result(run: CellRun, sink: Sink | None = None) -> CellResult | None:
    """The cell's value for the kernel to display, or None if it had none.

    When the value is a mesh, a sharding or an array, its view is shown first (once, from
    the first process's summary) and the value's text follows as the cell's result.
    """
    bundles = {
        r: dict(run.results[r].result)
        for r in run.procs
        if isinstance(run.results[r].result, dict) and run.results[r].result
    }
    if not bundles:
        return None
    summaries = [b.pop(SUMMARY_MIME) for b in bundles.values() if SUMMARY_MIME in b]
    if summaries:
        (sink or Sink()).view(summaries[0])
    return CellResult(bundles)
