"""One ``%%multihost`` execution as a state machine: events in, decisions out.

The driver (send.py) feeds it what the processes send, as ``(rank, kind, payload)``:

- ``iopub``: an iopub message (stream text, a display, the cell's value, an error);
- ``reply``: the execute request's future, done (an exception in it means the engine died);
- ``idle``: all of the request's output has arrived.

and asks :meth:`CellMachine.step` what to do next: wait (for an event, or until a time),
judge a possible hang, interrupt processes, or stop. The machine decides streaming,
errors, engine death, interrupts, timeouts, the grace after a first process finishes or
fails, and completion. It never calls ipyparallel, never sleeps, and reads the time only
from the clock it is given, so tests drive every path without a cluster.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..contract import NATIVE_MIME
from .collate import LineCollator
from .result import INTERRUPT_GRACE, CellRun, ProcResult, traceback_lines
from .sink import Sink

# Printed by gloo's C++ on the first collective of every device set; it says nothing a
# user can act on, and its "Rank" numbers are not process indices, which misleads.
# It goes to fd 1, where two gloo threads, or gloo and the cell's own print, may interleave:
# the message is cut out of whatever line it landed in, and its pieces are matched too.
NATIVE_NOISE = re.compile(
    r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks\.?"
    r"(?: Expected number of connected peer ranks is : \d+)?"
    r"|(?:\d+ peer ranks\. )?Expected number of connected peer ranks is : \d+"
)

# The file an engine compiles a cell as (ipykernel's temporary folder is per process, so
# every process names the same cell differently; IPython's older form is the same everywhere).
ENGINE_CELL_FILE = re.compile(r"(?:/[^\s:]*)?/ipykernel_\d+/\d+\.py")

# What the driver does next (Step.kind).
WAIT = "wait"
JUDGE = "judge"
INTERRUPT = "interrupt"
DONE = "done"
# Answers of a hang policy (see hang.py).
ACTIONS = ("report", "interrupt", "restart", "wait")


@dataclass(frozen=True)
class Step:
    """What the driver does next.

    Attributes
    ----------
    kind : str
        ``wait``: handle the next event, or call :meth:`CellMachine.step` again at
        ``until`` (None: no time limit); ``judge``: ask the hang policy about
        ``machine.run`` and pass its answer to :meth:`CellMachine.judged`; ``interrupt``:
        signal ``ranks`` and pass the ranks signalled to :meth:`CellMachine.interrupted`;
        ``done``: call :meth:`CellMachine.finish`.
    until : float or None
        Clock time of the next timer (``wait`` only).
    ranks : tuple of int
        Processes to interrupt (``interrupt`` only).
    """

    kind: str
    until: float | None = None
    ranks: tuple[int, ...] = ()


def error_from(content: dict) -> dict:
    """The error record of an iopub ``error`` message or an ipyparallel error."""
    return {
        "ename": content.get("ename"),
        "evalue": content.get("evalue"),
        "traceback": traceback_lines(content.get("traceback")),
    }


class CellMachine:
    """The state of one cell on a set of processes, advanced by events and a clock.

    Parameters
    ----------
    procs : sequence of int
        The processes the cell runs on, in display order.
    sink : Sink
        Where output goes.
    clock : callable
        Monotonic clock; the machine reads the time only from it.
    timeout : float, optional
        Seconds after which the cell is judged hung (``run.hang == "timeout"``).
    grace : float, optional
        Once a process has finished or failed, how long the others may keep running
        before the cell is judged (``failure`` if one failed, else ``divergence``).
    collate : bool
        Merge identical lines across processes.
    all_displays : bool
        Publish rich displays from every process, not only the first.
    window : float, optional
        How long a line waits for its twins (the collator's default when None).
    label : str
        How the cell's own file is named in what the processes print (a warning names the
        file it was raised in: each engine's temporary copy of the cell, all different).
    """

    def __init__(
        self,
        procs: Sequence[int],
        sink: Sink,
        *,
        clock: Callable[[], float] = time.monotonic,
        timeout: float | None = None,
        grace: float | None = None,
        collate: bool = True,
        all_displays: bool = False,
        window: float | None = None,
        label: str = "<cell>",
        on_wait: Callable[[list[int]], None] | None = None,
        wait_notice: float | None = None,
    ):
        procs = list(procs)
        # Called once, ``wait_notice`` seconds in, with the processes still running (the
        # caller asks whether they wait for processes that do not run the cell).
        self.on_wait = on_wait
        self.notice_at = clock() + wait_notice if on_wait and wait_notice is not None else None
        self.run = CellRun(procs=procs, results={r: ProcResult(rank=r) for r in procs})
        self.sink = sink
        self.clock = clock
        self.grace = grace
        self.all_displays = all_displays
        self.started = clock()
        self.deadline = self.started + timeout if timeout else None
        self.running = set(procs)
        self.first_done: float | None = None
        self.drain_until: float | None = None
        self.user_interrupted = False
        # watch (deadline and grace) -> judging -> wait (deadline only) | report (no
        # limit) | interrupt -> draining -> done -> finished
        self.phase = "watch"
        self._replied: set[int] = set()
        self._idle: set[int] = set()
        opts = {
            "collate": collate,
            "clock": clock,
            "drop": NATIVE_NOISE,
            "rename": lambda line: ENGINE_CELL_FILE.sub(lambda _m: label, line),
        }
        if window is not None:
            opts["window"] = window
        writers = (("stdout", sink.stdout), ("stderr", sink.stderr))
        self.streams = {name: LineCollator(procs, write, **opts) for name, write in writers}
        # Native lines (gloo, XLA, ...) arrive whole and separately: never in Python's lines.
        self.native = {name: LineCollator(procs, write, **opts) for name, write in writers}

    def _collators(self) -> list[LineCollator]:
        return [*self.streams.values(), *self.native.values()]

    def flush(self) -> None:
        """Show every held line now."""
        for c in self._collators():
            c.flush()

    # -- events -------------------------------------------------------------------------

    def feed(self, rank: int, kind: str, payload) -> None:
        """Take one event from process ``rank`` (see the module docstring for kinds)."""
        if kind == "iopub":
            self._message(rank, payload)
        elif kind == "reply":
            self._reply(rank, payload)
        elif kind == "idle":
            self._idle.add(rank)
        else:
            raise ValueError(f"unknown event kind {kind!r}")
        if rank in self.running and rank in self._replied and rank in self._idle:
            self._finish(rank)

    def _message(self, rank: int, msg: dict) -> None:
        msg_type = msg["header"]["msg_type"]
        content = msg["content"]
        if msg_type == "stream":
            self.streams[content["name"]].feed(rank, content["text"])
        elif msg_type == "display_data":
            self._display(rank, content)
        elif msg_type == "execute_result":
            self.run.results[rank].result = content.get("data", {})
        elif msg_type == "error":
            self.run.results[rank].error = error_from(content)

    def _display(self, rank: int, content: dict) -> None:
        native = content.get("data", {}).get(NATIVE_MIME)
        if native is not None:
            name = "stderr" if native.get("name") == "stderr" else "stdout"
            self.native[name].feed(rank, native.get("text", ""))
            return
        if rank != self.run.procs[0] and not self.all_displays:
            return
        self.flush()  # what was printed before the display shows before it
        self.sink.display(rank, content, label=self.all_displays)

    def _reply(self, rank: int, future) -> None:
        self._replied.add(rank)
        res = self.run.results[rank]
        exc = future.exception()
        if exc is not None:
            # The engine is gone (or the client closed): no idle message will come.
            res.status = "dead"
            res.error = res.error or {
                "ename": type(exc).__name__,
                "evalue": str(exc),
                "traceback": [],
            }
            self._idle.add(rank)
            return
        reply = future.result()
        # ipyparallel resolves the future with an ExecuteReply on success and with the
        # unwrapped error (a RemoteError, or TaskAborted) otherwise.
        if type(reply).__name__ == "ExecuteReply":
            res.status = "ok"
            return
        ename = getattr(reply, "ename", type(reply).__name__)
        if ename == "EngineError" and not getattr(reply, "engine_info", None):
            # The engine died while running the cell: the client made this error itself,
            # so it carries no engine's details (an error the cell raised, one of jaxsys's
            # own EngineError included, always does). Its traceback is of the client's
            # own bookkeeping, not of the cell: nothing for the user in it.
            res.status = "dead"
            res.error = res.error or {"ename": ename, "evalue": reply.evalue, "traceback": []}
            self._idle.add(rank)
            return
        res.status = "error"
        res.error = res.error or {
            "ename": ename,
            "evalue": getattr(reply, "evalue", str(reply)),
            "traceback": traceback_lines(getattr(reply, "traceback", None)),
        }

    def _finish(self, rank: int) -> None:
        self.running.discard(rank)
        for c in self._collators():
            c.finish(rank)
        if self.first_done is None:
            self.first_done = self.clock()

    # -- decisions ------------------------------------------------------------------------

    def step(self) -> Step:
        """What to do next (see :class:`Step`)."""
        if self.phase in (DONE, "finished"):
            return Step(DONE)
        for c in self._collators():
            c.pump()
        if self.phase == "judging":
            return Step(JUDGE)
        if self.phase == INTERRUPT:
            if self.running:
                return Step(INTERRUPT, ranks=tuple(sorted(self.running)))
            self.run.interrupted = []
            self.phase = DONE
        if not self.running:
            self.phase = DONE
        if self.phase == DONE:
            return Step(DONE)
        now = self.clock()
        if self.notice_at is not None and now >= self.notice_at:
            self.notice_at = None
            if self.phase == "watch" and self.running:
                self.flush()  # the notice comes after what was printed so far
                self.on_wait(sorted(self.running))
        if self.phase in ("watch", "wait") and self.deadline is not None and now >= self.deadline:
            return self._judge("timeout")
        hang_at = self._hang_at()
        if hang_at is not None and now >= hang_at:
            return self._judge("failure" if self.run.failed() else "divergence")
        if self.phase == "draining" and now >= self.drain_until:
            self.phase = DONE
            return Step(DONE)
        return Step(WAIT, until=self._next_timer(hang_at))

    def _hang_at(self) -> float | None:
        if self.phase != "watch" or self.grace is None or self.first_done is None:
            return None
        return self.first_done + self.grace

    def _next_timer(self, hang_at: float | None) -> float | None:
        times = [c.next_deadline() for c in self._collators()]
        if self.phase in ("watch", "wait"):
            times.append(self.deadline)
        times.append(hang_at)
        times.append(self.notice_at)
        if self.phase == "draining":
            times.append(self.drain_until)
        times = [t for t in times if t is not None]
        return min(times) if times else None

    def _judge(self, reason: str) -> Step:
        self.flush()  # the report comes after everything printed so far
        self.run.hang = reason
        self.run.timed_out = reason == "timeout"
        self.run.stuck = sorted(self.running)
        self.phase = "judging"
        return Step(JUDGE)

    def judged(self, action: str) -> None:
        """Take the hang policy's answer: ``report`` (keep waiting, without limit),
        ``interrupt``, ``restart`` (stop waiting; the caller restarts the world) or
        ``wait`` (not a hang: keep waiting until the deadline; divergences only)."""
        if action not in ACTIONS:
            raise ValueError(f"a hang policy answers one of {', '.join(ACTIONS)}, not {action!r}")
        if action == "wait" and self.run.hang != "divergence":
            raise ValueError(f"'wait' answers a divergence, not a {self.run.hang}")
        self.run.hang_action = action
        if action == "wait":
            # Not a hang after all (e.g. process 0 does extra work): wait on, but still
            # honour the deadline.
            self.run.hang, self.run.stuck = None, []
            self.phase = "wait"
        elif action == "report":
            self.phase = "report"
        elif action == "interrupt":
            self.phase = INTERRUPT
        else:
            self.phase = DONE

    def interrupted(self, ranks: Sequence[int]) -> None:
        """The driver signalled ``ranks``: give them time to report, then stop."""
        self.run.interrupted = list(ranks)
        self.drain_until = self.clock() + INTERRUPT_GRACE
        self.phase = "draining"

    def interrupt_requested(self) -> None:
        """The user pressed stop: the first time interrupts the processes still running,
        a second time stops waiting for them."""
        if self.user_interrupted:
            self.phase = DONE
            return
        self.user_interrupted = True
        self.phase = INTERRUPT

    def finish(self) -> CellRun:
        """Show what is held back and return the run (callable more than once)."""
        self.flush()
        if self.phase != "finished":
            self.run.seconds = self.clock() - self.started
        self.phase = "finished"
        return self.run
