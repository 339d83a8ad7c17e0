"""Run one cell on a set of JAX processes, streaming and collating what they print."""

from __future__ import annotations

import queue
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .._ranges import format_procs
from .collate import DEFAULT_WINDOW, LineCollator

# The mime type engines use for mesh/sharding summaries (engine/display.py); defined here
# too so that the kernel never imports engine code that could pull in JAX.
SUMMARY_MIME = "application/vnd.jaxsys.summary+json"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Engines number their cells independently, so "Cell In[7]" on one is "Cell In[9]" on another.
_CELL_NUMBER = re.compile(r"In\[\d+\]")
# Printed by gloo's C++ on the first collective of every device set; it says nothing a
# user can act on, and its "Rank" numbers are not process indices, which misleads.
# It goes to fd 1, where two gloo threads, or gloo and the cell's own print, may interleave:
# the message is cut out of whatever line it landed in, and its pieces are matched too.
NATIVE_NOISE = re.compile(
    r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks\.?"
    r"(?: Expected number of connected peer ranks is : \d+)?"
    r"|(?:\d+ peer ranks\. )?Expected number of connected peer ranks is : \d+"
)
# How long processes get to report after an interrupt or a timeout before the cell ends.
INTERRUPT_GRACE = 3.0


def strip_ansi(text: str) -> str:
    """Remove terminal colour codes."""
    return _ANSI.sub("", text)


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
    # Set when the cell was judged hung: why ("timeout" or "failure"), which processes were
    # still running then, and what was done about it ("report", "interrupt", "restart").
    hang: str | None = None
    stuck: list[int] = field(default_factory=list)
    hang_action: str | None = None

    def by_status(self, status: str) -> list[int]:
        """Ranks whose result has the given status."""
        return [r for r in self.procs if self.results[r].status == status]


class MultihostError(Exception):
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
        key = _CELL_NUMBER.sub("In[]", strip_ansi("\n".join(err.get("traceback") or []))) or (
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
        lines.extend(err.get("traceback") or [])
        lines.append("")
    return lines


class Sink:
    """Where a cell's output goes: the kernel's streams and display publisher.

    Parameters
    ----------
    on_summary : callable, optional
        Called with every mesh/sharding summary a process displays, before it is shown.
    """

    def __init__(self, on_summary: Callable[[dict], None] | None = None):
        self.on_summary = on_summary

    def stdout(self, text: str) -> None:
        """Write collated stdout text."""
        sys.stdout.write(text)
        sys.stdout.flush()

    def stderr(self, text: str) -> None:
        """Write collated stderr text."""
        sys.stderr.write(text)
        sys.stderr.flush()

    def display(self, rank: int, content: dict, label: bool) -> None:
        """Publish a rich display from process ``rank``."""
        from IPython.display import publish_display_data

        if label:
            self.stdout(f"[{format_procs([rank])}] display:\n")
        summary = content.get("data", {}).get(SUMMARY_MIME)
        if summary is not None:
            self.view(summary)
            return
        publish_display_data(
            data=content.get("data", {}),
            metadata=content.get("metadata", {}),
            transient=content.get("transient"),
        )

    def view(self, summary: dict) -> None:
        """Show the widget for a summary that a process displayed."""
        from IPython.display import display

        from ..widgets import view_for

        if self.on_summary is not None:
            self.on_summary(summary)
        display(view_for(summary))


def execute(
    cluster,
    code: str,
    procs: Sequence[int] | None = None,
    *,
    timeout: float | None = None,
    collate: bool = True,
    all_displays: bool = False,
    window: float = DEFAULT_WINDOW,
    sink: Sink | None = None,
    on_interrupt: Callable[[list[int]], None] | None = None,
    grace: float | None = None,
    on_hang: Callable[[CellRun], str] | None = None,
) -> CellRun:
    """Run ``code`` on the given processes and stream their output as it arrives.

    Parameters
    ----------
    cluster : jaxsys_kernel.Cluster
        A ready cluster.
    code : str
        The cell's source.
    procs : sequence of int, optional
        Processes to run on; all when omitted.
    timeout : float, optional
        Seconds after which processes still running are interrupted.
    collate : bool
        Merge identical lines across processes.
    all_displays : bool
        Publish rich displays from every process, not only the first selected one.
    window : float
        Seconds a line waits for its twins from the other processes.
    sink : Sink, optional
        Output destination; the current kernel's streams by default.
    on_interrupt : callable, optional
        Called with the ranks about to be interrupted, just before they are signalled.
    grace : float, optional
        Once a process has finished or failed, how long the others may keep running before
        ``on_hang`` is asked whether the cell is hung (they may wait for it in a collective).
    on_hang : callable, optional
        Called with the run when it is judged hung (``run.hang``, ``run.stuck`` set);
        returns ``"report"`` (keep waiting), ``"interrupt"`` (the default),
        ``"restart"`` (stop waiting; the caller restarts the world) or ``"wait"`` (not a
        hang: keep waiting until the deadline).

    Returns
    -------
    CellRun
        What each process did. Errors are not raised here; see :func:`raise_for_run`.
    """
    cluster._require_ready()
    procs = list(cluster.ranks if procs is None else procs)
    sink = sink or Sink()
    client = cluster.client
    socket = cluster.view._socket
    events: queue.SimpleQueue = queue.SimpleQueue()
    run = CellRun(procs=procs, results={r: ProcResult(rank=r) for r in procs})
    out = {
        name: LineCollator(procs, write, window=window, collate=collate, drop=NATIVE_NOISE)
        for name, write in (("stdout", sink.stdout), ("stderr", sink.stderr))
    }
    display_from = procs[0]

    idents, _ = client._build_targets(cluster.engine_ids(procs))
    t0 = time.monotonic()
    for rank, ident in zip(procs, idents, strict=True):

        def hook(fut, rank=rank):
            # Registered before the request is sent, so no output can slip past it.
            fut.iopub_callbacks.append(lambda msg: events.put((rank, "iopub", msg)))
            fut.add_done_callback(lambda f: events.put((rank, "reply", f)))
            fut.output.add_done_callback(lambda f: events.put((rank, "idle", None)))

        client.send_execute_request(
            socket, code, silent=False, ident=ident, message_future_hook=hook
        )

    replied: dict[int, object] = {}
    idle: set[int] = set()
    running = set(procs)
    deadline = t0 + timeout if timeout else None
    failed_at: list[float] = []

    def finish(rank: int) -> None:
        running.discard(rank)
        for c in out.values():
            c.finish(rank)

    def handle(rank: int, kind: str, payload) -> None:
        if kind == "iopub":
            msg_type = payload["header"]["msg_type"]
            content = payload["content"]
            if msg_type == "stream":
                out[content["name"]].feed(rank, content["text"])
            elif msg_type == "display_data":
                if rank == display_from or all_displays:
                    for c in out.values():
                        c.flush()
                    sink.display(rank, content, label=all_displays)
            elif msg_type == "execute_result":
                run.results[rank].result = content.get("data", {})
            elif msg_type == "error":
                run.results[rank].error = {
                    "ename": content.get("ename"),
                    "evalue": content.get("evalue"),
                    "traceback": content.get("traceback") or [],
                }
        elif kind == "reply":
            replied[rank] = payload
            exc = payload.exception()
            if exc is not None:
                # The engine is gone (or the client closed): no idle message will come.
                run.results[rank].status = "dead"
                run.results[rank].error = run.results[rank].error or {
                    "ename": type(exc).__name__,
                    "evalue": str(exc),
                    "traceback": [],
                }
                idle.add(rank)
            else:
                reply = payload.result()
                # ipyparallel resolves the future with an ExecuteReply on success and with
                # the unwrapped error (or TaskAborted) otherwise.
                if type(reply).__name__ == "ExecuteReply":
                    run.results[rank].status = "ok"
                else:
                    run.results[rank].status = "error"
                    run.results[rank].error = run.results[rank].error or {
                        "ename": getattr(reply, "ename", type(reply).__name__),
                        "evalue": getattr(reply, "evalue", str(reply)),
                        "traceback": getattr(reply, "traceback", None) or [],
                    }
        elif kind == "idle":
            idle.add(rank)
        if rank in running and rank in replied and rank in idle:
            finish(rank)
            if not failed_at:
                failed_at.append(time.monotonic())

    def wait_step(until: float | None, watch: bool = False) -> str | None:
        """Handle events until ``until`` (-> "deadline"), or, with ``watch``, until the
        processes still running outlive a failed one by ``grace`` (-> "failure"); None
        once nothing is left to wait for."""
        while running:
            now = time.monotonic()
            hang_at = failed_at[0] + grace if (watch and failed_at and grace is not None) else None
            limits = [
                t
                for t in (
                    until,
                    hang_at,
                    out["stdout"].next_deadline(),
                    out["stderr"].next_deadline(),
                )
                if t
            ]
            wait = max(0.0, min(limits) - now) if limits else 0.5
            try:
                rank, kind, payload = events.get(timeout=min(wait, 0.5))
            except queue.Empty:
                for c in out.values():
                    c.pump()
                now = time.monotonic()
                if until is not None and now >= until:
                    return "deadline"
                if hang_at is not None and now >= hang_at and running:
                    return "failure"
                continue
            handle(rank, kind, payload)
        return None

    def interrupt_running() -> None:
        if on_interrupt and running:
            on_interrupt(sorted(running))
        run.interrupted = cluster.interrupt(sorted(running))
        wait_step(time.monotonic() + INTERRUPT_GRACE)

    try:
        try:
            reason = wait_step(deadline, watch=True)
            if reason is not None:
                for c in out.values():
                    c.flush()
                failed = any(run.results[r].status in ("error", "dead") for r in procs)
                if reason == "deadline":
                    run.hang = "timeout"
                else:
                    run.hang = "failure" if failed else "divergence"
                run.timed_out = reason == "deadline"
                run.stuck = sorted(running)
                action = on_hang(run) if on_hang else "interrupt"
                run.hang_action = action
                if action == "wait":
                    # Not a hang after all (e.g. process 0 does extra work): wait on, but
                    # still honour the deadline.
                    run.hang = None
                    run.stuck = []
                    if wait_step(deadline) is not None:
                        run.hang, run.timed_out, run.stuck = "timeout", True, sorted(running)
                        action = run.hang_action = on_hang(run) if on_hang else "interrupt"
                if action == "report":
                    wait_step(None)
                elif action == "interrupt":
                    interrupt_running()
        except KeyboardInterrupt:
            try:
                interrupt_running()
            except KeyboardInterrupt:
                pass  # a second interrupt: stop waiting, report what we have
            raise_interrupted = True
        else:
            raise_interrupted = False
    finally:
        for c in out.values():
            c.flush()
    run.seconds = time.monotonic() - t0
    if raise_interrupted:
        raise MultihostInterrupt(run, interrupt_summary(run))
    return run


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


def raise_for_run(run: CellRun) -> None:
    """Raise :class:`MultihostError` (or :class:`MultihostTimeout`) if any process failed.

    Parameters
    ----------
    run : CellRun
        The outcome of :func:`execute`.
    """
    failed = [r for r in run.procs if run.results[r].status in ("error", "dead")]
    if run.hang == "divergence":
        finished = format_procs(run.by_status("ok"))
        raise MultihostHang(
            run,
            f"{format_procs(run.stuck)} waited inside JAX (a collective) that {finished} never "
            "entered: the program took different paths on different processes; "
            f"{format_procs(run.stuck)} were {'interrupted' if run.hang_action == 'interrupt' else 'stopped'}",
        )
    if run.hang == "failure":
        kinds = ", ".join(
            f"{err.get('ename')} on {format_procs(ranks)}" for ranks, err in group_errors(run)
        )
        done = {"interrupt": "interrupted", "restart": "stopped by a world restart"}.get(
            run.hang_action or "", "left running"
        )
        unstopped = run.by_status("running")
        if run.hang_action == "interrupt" and unstopped:
            done += f", but {format_procs(unstopped)} did not stop within {INTERRUPT_GRACE:g} s"
        raise MultihostHang(
            run,
            f"{kinds}; {format_procs(run.stuck)} kept running (waiting for the failed "
            f"process, most likely in a collective) and were {done}",
        )
    if run.timed_out:
        finished = run.by_status("ok")
        still = run.stuck
        msg = f"cell timed out after {run.seconds:.1f} s; still running: {format_procs(still) if still else 'none'}"
        if finished:
            msg += f"; finished: {format_procs(finished)}"
        raise MultihostTimeout(run, msg)
    if failed:
        kinds = ", ".join(
            f"{err.get('ename')} on {format_procs(ranks)}" for ranks, err in group_errors(run)
        )
        raise MultihostError(run, f"{len(failed)} of {len(run.procs)} processes failed: {kinds}")


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
