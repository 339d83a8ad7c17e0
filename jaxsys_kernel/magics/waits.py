"""No silent wait: a cell whose processes wait inside JAX for processes that do not run it.

A ``--procs 0`` cell that reaches a collective over every device, or a cell beside dead
processes, waits for peers that will never come; the hang doctor judges a hang only once a
process has failed or the timeout passed. A few seconds in, :class:`WaitCheck` looks at the
stacks of the processes still running and, if they wait inside JAX while others do not run
the cell, says so, naming both, and the session's state shows the wait.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from .._ranges import format_procs
from ..cells import report

#: Seconds into a cell before the check looks (the notice must come within 5 s).
WAIT_NOTICE = 3.0
#: A cell line that calls JAX (its jitted functions run in C++, below any Python frame).
_JAX_CALL = re.compile(r"\b(?:jax|jnp|lax|jit|pjit|shard_map|multihost_utils)\b")
#: Seconds the stacks may take to arrive.
STACK_TIMEOUT = 1.5


def absent(cluster, ranks: Sequence[int]) -> dict[int, str]:
    """The processes not running a cell on ``ranks``, each with why (idle, dead...)."""
    out = {}
    for r in cluster.ranks:
        state = cluster.processes[r].state
        if r not in ranks:
            out[r] = "idle" if state == "ready" else state
        elif state != "ready":
            out[r] = state
    return out


class WaitCheck:
    """The check for one cell; ``__call__`` is the cell machine's ``on_wait``.

    Parameters
    ----------
    cluster : Cluster
    ranks : sequence of int
        The processes the cell runs on.
    away : dict of int to str
        :func:`absent`'s answer for them.
    say : callable
        Prints a line to the cell (its stderr).
    show : callable
        Called with the wait, in words, for the state the front end reads.
    code : str
        The cell's code (a stack names its lines).
    """

    def __init__(self, cluster, ranks, away: dict[int, str], say: Callable, show: Callable, code):
        self.cluster, self.ranks, self.away = cluster, list(ranks), away
        self.say, self.show, self.code = say, show, code

    def __call__(self, running: list[int]) -> None:
        try:
            stacks = self.cluster.dump_stacks(running, timeout=STACK_TIMEOUT)
        except Exception:  # noqa: BLE001 - a notice must never fail the cell
            return
        waiting = [r for r in running if self._in_jax(stacks.get(r, ""))]
        if not waiting:
            return
        whom = "; ".join(f"{format_procs(rs)} {why}" for why, rs in _by_reason(self.away).items())
        verb = "waits" if len(waiting) == 1 else "wait"
        where = report.process_stack(stacks[waiting[0]], self.code)[-1].strip().lstrip(">* ")
        self.show(f"{format_procs(waiting)} {verb} for {format_procs(list(self.away))}")
        self.say(
            f"jaxsys: {format_procs(waiting)} {verb} in a JAX call ({where}) while "
            f"{whom} {'does' if len(self.away) == 1 else 'do'} not run this cell: a collective "
            f"over their devices cannot finish. Interrupt the cell (stop button) and run it on "
            f"every process (%%multihost), or use only {format_procs(self.ranks)}'s devices."
        )

    def _in_jax(self, dump: str) -> bool:
        """Whether a stack waits in JAX: in its frames, or (a compiled function called from
        C++ leaves no Python frame of JAX's) blocked right in a cell line that calls JAX."""
        frames = report.main_frames(dump)
        if not frames:
            return False
        # JAX's live-devices barrier is made to finish without dead processes: it waits
        # for the heartbeat to declare them dead, then answers with the others.
        dead_only = all(why == "dead" for why in self.away.values())
        if dead_only and any(f.func in _ENDS_WITHOUT_THEM for f in frames):
            return False
        if report.waits_in_jax(frames):
            return True
        if not frames[0].in_cell:
            return False
        return bool(_JAX_CALL.search(report.process_stack(dump, self.code)[-1]))


# Frames of JAX calls that finish when some processes are dead or away.
_ENDS_WITHOUT_THEM = frozenset({"_live_devices", "live_devices"})


def _by_reason(away: dict[int, str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r, why in sorted(away.items()):
        out.setdefault(why, []).append(r)
    return out


def check_for(cluster, ranks: Sequence[int], sink, show: Callable, code: str) -> WaitCheck | None:
    """The check for a cell on ``ranks`` that tells the cell's ``sink``, or None when every
    process runs it."""
    away = absent(cluster, ranks)
    if not away:
        return None
    return WaitCheck(cluster, ranks, away, lambda line: sink.stderr(line + "\n"), show, code)
