"""The session's controls: the buttons of the views and the sidebar, served on a subshell so
that they work while a cell blocks. What a button does is declared in
:mod:`~jaxsys_kernel.magics.commands`, the same table ``%jaxsys`` and the comm use."""

from __future__ import annotations

import time

from .. import _compat
from . import commands


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

    def control(self, view, action: str, rank: int | None) -> commands.Result:
        """Carry out a dashboard button's command (runs on the control subshell).

        ``view`` shows the outcome: its ``control_status`` and its log. The command's
        meaning is the registry's (:data:`~jaxsys_kernel.magics.commands.COMMANDS`):
        ``restart`` with a process replaces it, without one the world.
        """
        stamp = time.strftime("%H:%M:%S")

        def say(text: str) -> None:
            view.control_status = text
            view.update(append=[f"{stamp} {text}"])

        result = commands.run(self, action, rank, surface="dashboard", progress=say)
        if result.log:  # a command's own lines (stacks) carry their stamp
            view.update(append=list(result.log))
        say(result.message)
        return result
