"""The one declaration of what the kernel and the JupyterLab extension say to each other.

The ``jaxsys`` comm (:mod:`jaxsys_kernel.kernel.comm`) and the extension's
``labextension/src/protocol.ts`` both follow this module: its schema version, the actions
a front end may send, and the states a process is shown in. A unit test parses the
TypeScript file and compares it with these declarations, so a change on one side that the
other lacks fails the suite instead of a user's sidebar.

One vocabulary: the *cluster* is ``ready`` (or starting, restarting, out of step, degraded,
stopped: :mod:`jaxsys_kernel.magics.health`), and each of its *processes* is in a
:class:`ProcessState`, ``alive`` when usable. The cluster's own records
(:mod:`jaxsys_kernel.cluster.records`) call a usable process ``ready``; :func:`shown_state`
is the one place that word becomes ``alive``, and ``ProcessState("ready")`` reads it too.
"""

from __future__ import annotations

import enum
import functools

__all__ = [
    "ACTIONS",
    "DELTA_FIELDS",
    "FRONT_END_MESSAGES",
    "GROUP_FIELDS",
    "INTERFACES",
    "KERNEL_MESSAGES",
    "RANK_ACTIONS",
    "SCHEMA_VERSION",
    "SUMMARY_FIELDS",
    "ProcessState",
    "shown_state",
    "version_mismatch",
]

#: The comm's schema version; the front end sends its own in the open message. Version 2
#: sends ``delta`` messages after the first state, which a version 1 front end cannot read.
SCHEMA_VERSION = 2
#: Versions a kernel still serves: a version 1 front end gets the whole state every time.
SERVED_VERSIONS = (1, SCHEMA_VERSION)

#: What the kernel sends: the whole state, what changed in it, the answer to a command,
#: and a command another surface (``%jaxsys``, the dashboard) carried out.
KERNEL_MESSAGES = ("state", "delta", "reply", "event")
#: What a front end sends: a command, a request for the whole state, a group to open.
FRONT_END_MESSAGES = ("command", "refresh", "group")
#: A ``delta`` message's ``rows`` (:class:`jaxsys_kernel.telemetry.aggregate.RowFeed`):
#: the rows' version, the version it applies to, changed rows and gone ranks, and ages.
DELTA_FIELDS = ("v", "base", "rows", "gone", "ages")
#: The summary of a cluster above the group size (:func:`~jaxsys_kernel.telemetry.
#: aggregate.summarize`).
SUMMARY_FIELDS = ("by_state", "group_size", "groups", "errors")
#: One group of consecutive ranks in a summary.
GROUP_FIELDS = ("group", "ranks", "hosts", "states", "worst", "busy", "oldest_heartbeat")

#: Every action a front end may send, in the order the TypeScript union lists them: the
#: commands the registry (:mod:`jaxsys_kernel.magics.commands`) offers on the comm, then
#: their old names (a unit test compares the three). ``restart`` with a rank replaces one
#: process, without one the whole world.
ACTIONS = (
    "start",
    "stop-cluster",
    "interrupt",
    "stop",  # the old name of "interrupt", still accepted
    "stacks",
    "kill",
    "restart",
    "restart-world",  # the old name of "restart" without a rank, still accepted
)
#: Actions that cannot run without a process (``restart`` and ``stacks`` may name one).
RANK_ACTIONS = ("kill",)

#: The fields of every interface of ``protocol.ts``, in its order: what the kernel sends
#: and what a front end sends (a unit test compares each, and what the comm builds).
INTERFACES = {
    "IProcess": (
        "rank",
        "host",
        "pid",
        "devices",
        "state",
        "heartbeat_age",
        "busy",
        "error",
        "incarnation",
        "restarts",
    ),
    "ICache": (
        "requests",
        "hits",
        "hit_rate",
        "compiles",
        "compile_time",
        "time_saved",
        "entries",
        "bytes",
    ),
    "IGroup": GROUP_FIELDS,
    "ISummary": SUMMARY_FIELDS,
    "IRowDelta": DELTA_FIELDS,
    "ICluster": (
        "state",
        "nprocs",
        "alive",
        "devices",
        "live_devices",
        "warning",
        "processes",
        "summary",
        "group",
        "cache",
        "security",
        "heartbeat_timeout",
    ),
    "IHealth": ("state", "reason", "warning"),
    "IState": ("kernel", "cell_running", "time", "health", "cluster", "error"),
    "IStateMessage": ("type", "v", "state", "version"),
    "IDeltaMessage": ("type", "v", "state", "rows", "summary"),
    "IGroupRequest": ("type", "group"),
    "IReply": ("type", "id", "action", "ok", "message", "log"),
    "IEvent": ("type", "surface", "action", "rank", "ok", "message", "log"),
    "ICommand": ("type", "action", "rank", "id"),
}


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

    @classmethod
    def _missing_(cls, value: object) -> ProcessState | None:
        # The cluster's records word two states their own way; readers of those words
        # (``ProcessState("ready")``) get the shown state rather than a ValueError.
        return _RECORD_WORDS.get(value)  # type: ignore[arg-type]


#: The cluster's words for a process (``ProcessInfo.state``) that differ from the shown ones.
_RECORD_WORDS = {"ready": ProcessState.ALIVE, "failed": ProcessState.DEAD}


@functools.cache  # a few words in, one of six out; called per process per state push
def shown_state(record: str | None, heartbeat: ProcessState | None = None) -> ProcessState:
    """The state a process is shown in, from the cluster's record and its heartbeats.

    The one translation between the cluster's word for a process and the views' word:
    the telemetry hub and the comm (without telemetry) both call it.

    Parameters
    ----------
    record : str or None
        The cluster's state for the process: ``starting``, ``ready``, ``restarting`` or
        ``dead`` (None, or an unknown word, counts as ``ready``: the heartbeats decide).
    heartbeat : ProcessState, optional
        What its heartbeats say (``alive``, ``stuck``, ``dead`` or ``unknown``); None
        without telemetry, when the record is all there is.

    Returns
    -------
    ProcessState

    Examples
    --------
    >>> shown_state("ready"), shown_state("ready", ProcessState.STUCK)
    (<ProcessState.ALIVE: 'alive'>, <ProcessState.STUCK: 'stuck'>)
    """
    try:
        said = ProcessState(record)
    except ValueError:
        said = ProcessState.ALIVE
    if heartbeat is None or said in (ProcessState.DEAD, ProcessState.RESTARTING):
        return said
    if said is ProcessState.STARTING:
        # Heartbeats start before the kernel has seen the process join: until then it is
        # not usable, whatever its (or its predecessor's) beats say.
        return ProcessState.RESTARTING
    return heartbeat


#: States that turn the status bar to its warning colour.
WARNING_STATES = (ProcessState.DEAD, ProcessState.STUCK)


def version_mismatch(theirs: object) -> str | None:
    """The message for a front end speaking another schema version (None: they agree).

    Parameters
    ----------
    theirs : object
        The ``v`` the front end sent when it opened the comm (None when it sent none, which
        older front ends do: they are taken to speak version 1, which is still served).
    """
    if theirs is None:
        theirs = 1
    if theirs in SERVED_VERSIONS:
        return None
    return (
        f"the jaxsys extension speaks comm schema version {theirs!r} and this kernel speaks "
        f"version {SCHEMA_VERSION}: install the same jaxsys version in the kernel's "
        "environment and in JupyterLab's, then reload the page"
    )
