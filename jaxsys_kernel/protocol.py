"""The one declaration of what the kernel and the JupyterLab extension say to each other.

The ``jaxsys`` comm (:mod:`jaxsys_kernel.kernel.comm`) and the extension's
``labextension/src/protocol.ts`` both follow this module: its schema version, the actions
a front end may send, and the states a process is shown in. A unit test parses the
TypeScript file and compares it with these declarations, so a change on one side that the
other lacks fails the suite instead of a user's sidebar.
"""

from __future__ import annotations

import enum

__all__ = ["ACTIONS", "RANK_ACTIONS", "SCHEMA_VERSION", "ProcessState", "version_mismatch"]

#: The comm's schema version; the front end sends its own in the open message.
SCHEMA_VERSION = 1

#: Every action a front end may send, in the order the TypeScript union lists them.
ACTIONS = (
    "start",
    "stop-cluster",
    "interrupt",
    "stop",  # the old name of "interrupt", still accepted
    "stacks",
    "kill",
    "restart",
    "restart-world",
)
#: Actions that name one process.
RANK_ACTIONS = ("kill", "restart")


class ProcessState(enum.StrEnum):
    """The state a process is shown in (sidebar, status bar and live views)."""

    #: Heartbeats arrive and the cluster counts it in.
    ALIVE = "alive"
    #: Busy in a cell and its heartbeats stopped: likely blocked in native code.
    STUCK = "stuck"
    #: Gone: its pid, the hub or missed heartbeats say so.
    DEAD = "dead"
    #: Being replaced, or launched and not yet part of the JAX world.
    RESTARTING = "restarting"
    #: Launched during a cluster start, not yet initialised.
    STARTING = "starting"
    #: No heartbeat yet, or telemetry is not receiving.
    UNKNOWN = "unknown"


#: States that turn the status bar to its warning colour.
WARNING_STATES = (ProcessState.DEAD, ProcessState.STUCK)


def version_mismatch(theirs: object) -> str | None:
    """The message for a front end speaking another schema version (None: they agree).

    Parameters
    ----------
    theirs : object
        The ``v`` the front end sent when it opened the comm (None when it sent none, which
        older front ends do: they are taken to speak version 1).
    """
    if theirs is None:
        theirs = 1
    if theirs == SCHEMA_VERSION:
        return None
    return (
        f"the jaxsys extension speaks comm schema version {theirs!r} and this kernel speaks "
        f"version {SCHEMA_VERSION}: install the same jaxsys version in the kernel's "
        "environment and in JupyterLab's, then reload the page"
    )
