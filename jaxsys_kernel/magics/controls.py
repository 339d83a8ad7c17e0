"""The session's controls: the buttons of the views and the sidebar, served on a subshell so
that they work while a cell blocks."""

from __future__ import annotations

import os
import signal
import time

from .. import _compat
from .._ranges import format_procs
from ..cells import report

# The comm's and the views' verbs; "stop" is the old name of "interrupt".
ALIASES = {"stop": "interrupt"}


class Controls:
    """Control actions from widgets (a part of
    :class:`~jaxsys_kernel.magics.session.MultihostSession`)."""

    def _attach_controls(self, view) -> None:
        """Serve the view's buttons on a subshell, so they work while a cell blocks."""
        subshell = self.control_subshell()
        if subshell is None:
            return
        view.on_control(lambda action, rank: self.control(view, action, rank))
        # Pinning the comm keeps the clicks on the subshell even though updates are
        # published from other threads.
        _compat.route_comm_to_subshell(view.comm, subshell)

    def control(self, view, action: str, rank: int | None) -> None:
        """Carry out a control button's action (runs on the control subshell).

        ``view`` shows the outcome: its ``control_status`` and its log. ``stop`` is the old
        name of ``interrupt`` (the running cell, not the cluster).
        """
        action = ALIASES.get(action, action)
        stamp = time.strftime("%H:%M:%S")

        def say(text: str) -> None:
            view.control_status = text
            view.update(append=[f"{stamp} {text}"])

        handler = _HANDLERS.get(action)
        try:
            if self.cluster is None or self.cluster.state != "ready":
                say("no cluster is running")
            elif handler is None or (action in RANK_CONTROLS and rank is None):
                say(f"unknown control {action!r}")
            else:
                handler(self, rank, say, lambda line: view.update(append=[f"{stamp} {line}"]))
        except Exception as e:  # noqa: BLE001 - a control reports its failure in the view
            say(f"{action} failed: {e}")


def _interrupt(session, rank, say, log) -> None:
    # The cell waits in the main thread: interrupt it as the stop button would.
    os.kill(os.getpid(), signal.SIGINT)
    say("interrupt: interrupting the running cell")


def _stacks(session, rank, say, log) -> None:
    cluster = session.cluster
    ranks = cluster.ranks if rank is None else [int(rank)]
    stacks = cluster.dump_stacks(ranks)
    for r in ranks:
        first, *rest = report.process_stack(stacks.get(r, ""))
        log(f"p{r} {first}")
        for line in rest:
            log(f"    {line}")
    say(f"stacks of {format_procs(ranks)} in the log (your code first, or idle)")


def _kill(session, rank, say, log) -> None:
    took = session.cluster.kill_process(int(rank))
    say(f"p{rank} killed (gone after {took:.2f} s)")


def _restart(session, rank, say, log) -> None:
    say(f"p{rank} restarting...")
    took = session.cluster.restart_process_sync(int(rank))
    say(f"p{rank} rejoined in {took:.1f} s")


def _restart_world(session, rank, say, log) -> None:
    say("restarting the JAX world...")
    took = session.restart()
    say(f"JAX world restarted in {took:.1f} s")


# One handler per verb; the comm's CONTROL_ACTIONS are these names.
_HANDLERS = {
    "interrupt": _interrupt,
    "stacks": _stacks,
    "kill": _kill,
    "restart": _restart,
    "restart-world": _restart_world,
}
CONTROLS = tuple(_HANDLERS)
RANK_CONTROLS = ("kill", "restart")
