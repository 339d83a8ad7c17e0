"""The hang policy: what to do once a cell looks hung (``--on-hang``).

The cell machine (run.py) decides *when* to ask: at ``--timeout``, or ``--grace`` seconds
after a first process finished or failed while others still run. The policy looks at the
stacks of the processes still running and answers: ``wait`` when nothing is stuck (some
processes just have more work), else it prints the hang report and applies ``--on-hang``.
Interrupting a process inside JAX leaves the world out of step (an abandoned collective
cannot be cancelled on CPU), which the policy records in :attr:`HangPolicy.broken`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

from .._ranges import format_procs
from . import report
from .result import CellRun

ON_HANG = ("report", "interrupt", "restart")

# Cluster.dump_stacks(ranks, timeout) -> {rank: faulthandler dump}
DumpStacks = Callable[..., dict]


def world_broken_message(reason: str) -> str:
    """The error a cell gets while the JAX world is out of step."""
    return (
        f"the JAX world is out of step ({reason}). On CPU an interrupted or abandoned "
        "collective cannot be cancelled, so the next collective would hang: run "
        "%jaxsys restart (a few seconds), or add --force if this cell runs no collective"
    )


def broken_reason(ranks: Sequence[int], clock: Callable[[], str] | None = None) -> str:
    """Why the world is out of step: who was interrupted inside JAX, and when."""
    stamp = (clock or (lambda: time.strftime("%H:%M:%S")))()
    return f"{format_procs(ranks)} interrupted inside JAX at {stamp}"


def _say(text: str) -> None:
    print(text, file=sys.stderr)


class HangPolicy:
    """Judge a cell that looks hung, report it, and say what to do.

    Parameters
    ----------
    action : str
        ``report``, ``interrupt`` or ``restart`` (``--on-hang``).
    dump_stacks : callable
        ``dump_stacks(ranks, timeout=...)``: faulthandler dumps by rank
        (``Cluster.dump_stacks``).
    timeout, grace : float or None
        The cell's ``--timeout`` and ``--grace``, for the report's first line.
    code : str, optional
        The cell's source, to quote the user's lines in the report.
    say : callable
        Where messages go (the kernel's stderr by default).

    Attributes
    ----------
    broken : str or None
        Set when processes were interrupted inside JAX: why the world is out of step.
    judged : bool
        Whether a hang report was printed.
    """

    def __init__(
        self,
        action: str,
        dump_stacks: DumpStacks,
        *,
        timeout: float | None = None,
        grace: float | None = None,
        code: str | None = None,
        say: Callable[[str], None] = _say,
    ):
        if action not in ON_HANG:
            raise ValueError(f"--on-hang must be one of {', '.join(ON_HANG)}, got {action!r}")
        self.action = action
        self.dump_stacks = dump_stacks
        self.timeout = timeout
        self.grace = grace
        self.code = code
        self.say = say
        self.broken: str | None = None
        self.judged = False

    def reason(self, run: CellRun) -> str:
        """Why the cell is judged hung, for the report's first line."""
        stuck = format_procs(run.stuck)
        if run.hang == "timeout":
            return f"the cell passed its timeout of {self.timeout:g} s"
        if run.hang == "divergence":
            return (
                f"{format_procs(run.by_status('ok'))} finished, but {stuck} still wait inside "
                f"JAX {self.grace:g} s later: the processes took different paths"
            )
        failed = format_procs(run.failed())
        return f"{failed} failed and {stuck} kept running for {self.grace:g} s more"

    def __call__(self, run: CellRun) -> str:
        """Answer the cell machine: ``wait``, or the ``--on-hang`` action after a report."""
        stacks = self.dump_stacks(run.stuck)
        in_jax = report.waiting_in_jax(stacks, run.stuck)
        if run.hang == "divergence" and not (stacks and all(in_jax)):
            return "wait"  # extra work on some processes, not a stuck collective
        self.judged = True
        self.say(report.report(run, stacks, self.reason(run), code=self.code))
        stuck = format_procs(run.stuck)
        if self.action == "interrupt":
            self.say(f"jaxsys: interrupting {stuck}")
            if any(in_jax):
                self.broken = broken_reason(run.stuck)
        elif self.action == "restart":
            self.say("jaxsys: restarting the JAX world")
        else:
            self.say("jaxsys: still waiting (--on-hang report); press stop to interrupt")
        return self.action

    def interrupting(self, ranks: list[int]) -> None:
        """Before processes are interrupted (stop button, or ``interrupt``): note whether
        they wait inside JAX, which leaves the world out of step."""
        if self.judged:
            return  # the hang report has already looked at them
        stacks = self.dump_stacks(ranks, timeout=1.0)
        if any(report.waiting_in_jax(stacks, ranks)):
            self.broken = broken_reason(ranks)
            self.say(
                f"jaxsys: interrupting {format_procs(ranks)} while "
                f"{'it waits' if len(ranks) == 1 else 'they wait'} inside JAX; "
                "the JAX world is now out of step: run %jaxsys restart."
            )
