"""The cluster's state in one word, from one place, for every view that shows it.

The status bar, the sidebar, ``%jaxsys status`` and the dashboard all say what
:func:`health` says, so that none of them can call a cluster "ready" while cells are
refused as out of step.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._ranges import format_procs
from ..cluster.bringup import controller_failure

READY = "ready"
STARTING = "starting"
RESTARTING = "restarting"
OUT_OF_STEP = "out of step"
DEGRADED = "degraded"
STOPPED = "stopped"
#: Processes wait inside JAX for processes that do not run the cell.
WAITING = "waiting"
#: Every state, in the order a reader would look for trouble.
STATES = (READY, STARTING, RESTARTING, OUT_OF_STEP, DEGRADED, WAITING, STOPPED)
#: States in which the views warn.
WARNING = (OUT_OF_STEP, DEGRADED, WAITING)
# Process states that make a cluster degraded, or (coming back) restarting.
_UNWELL = ("dead", "stuck")
_RETURNING = ("restarting", "starting")


@dataclass(frozen=True)
class Health:
    """The cluster's state and, where it is not plain, why.

    Attributes
    ----------
    state : str
        One of :data:`STATES`.
    reason : str
        One sentence for a reader (empty when ``ready``).
    """

    state: str
    reason: str = ""
    #: A state that is usually quiet but warns here (every process of a cluster dead).
    alarm: bool = False

    @property
    def warning(self) -> bool:
        """Whether views should show this state as a warning."""
        return self.state in WARNING or self.alarm

    def line(self) -> str:
        """``cluster: out of step (why)``, as ``%jaxsys status`` prints it."""
        return f"cluster: {self.state}" + (f" ({self.reason})" if self.reason else "")

    def to_dict(self) -> dict:
        """The form the front end reads."""
        return {"state": self.state, "reason": self.reason, "warning": self.warning}


def health(
    cluster, broken: str | None = None, process_states=None, waiting: str | None = None
) -> Health:
    """The cluster's state from what the kernel knows.

    Parameters
    ----------
    cluster : Cluster or None
        The kernel's cluster.
    broken : str, optional
        Why the JAX world is out of step (the session's ``broken``), if it is.
    process_states : mapping of int to str, optional
        Each process's state as the views show it (``alive``, ``dead``, ``stuck``, ...);
        the cluster's own records when left out.
    waiting : str, optional
        Who waits for whom in the running cell (the session's ``waiting``), if anyone.

    Returns
    -------
    Health
    """
    if cluster is None or cluster.state == STOPPED:
        return Health(STOPPED, "no cluster is running; %jaxsys start starts one")
    if cluster.state == "stopping":
        return Health(STOPPED, "the cluster is stopping")
    if cluster.state in (STARTING, RESTARTING):
        return Health(cluster.state, f"the cluster is {cluster.state}")
    if broken:
        return Health(OUT_OF_STEP, f"{broken}; cells are refused until %jaxsys restart")
    if process_states is None:
        process_states = {p.rank: p.state for p in cluster.processes}
    unwell: dict[str, list[int]] = {}
    for rank, state in sorted(process_states.items()):
        if state in (*_UNWELL, *_RETURNING):
            unwell.setdefault(state, []).append(rank)
    said = ", ".join(f"{format_procs(ranks)} {state}" for state, ranks in unwell.items())
    if process_states and unwell.get("dead") and len(unwell["dead"]) == len(process_states):
        # Nothing is left to be degraded: the world is gone (process 0's death ends all).
        return Health(
            STOPPED, f"every process is dead ({said}); %jaxsys restart starts them again", True
        )
    lost = controller_lost(cluster)
    if lost:
        return Health(DEGRADED, f"{said}; {lost}" if said else lost)
    if any(state in _UNWELL for state in unwell):
        return Health(DEGRADED, said)
    if unwell:
        return Health(RESTARTING, said)
    if waiting:
        return Health(WAITING, f"{waiting}, which do not run the cell")
    return Health(READY)


def controller_lost(cluster) -> str | None:
    """What the death of the cluster's ipyparallel controller means and what to do, or
    None while it runs. Its schedulers run on in their own processes, so cells still
    work; but no process can register any more, so no restart can succeed."""
    world = getattr(cluster, "world", None)
    if getattr(world, "ipp", None) is None:
        return None
    why = controller_failure(world)
    if why is None:
        return None
    return (
        f"{why.split(';', 1)[0]}: cells still run, but no process can be restarted or "
        "replaced; save what the processes hold, then %jaxsys stop and %jaxsys start"
    )
