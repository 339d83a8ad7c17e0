"""What a user is told after a fault: what was lost and the commands that bring the program back.

Every message here ends in a path that works when followed as printed: a process killed is
either brought back with ``%jaxsys restart P`` (it starts empty; the restart then lists the
names it lacks and what a collective needs on this platform) or, where it cannot come back
alone, the whole world is restarted.
"""

from __future__ import annotations

from ..engine.registry import engine_module
from ..errors import ClusterError

probes = engine_module("probes")

#: Said after every world restart: nothing the cells built survives it.
WORLD_LOST = (
    "All names defined on the processes are gone; re-run the cells that built them, "
    "or restore from a checkpoint."
)
#: On CPU, what a collective needs after one process rejoined (gloo keeps a communicator
#: per ordered device list, and the old ones still refer to the dead incarnation).
CPU_COLLECTIVE = (
    "On CPU a collective now needs a device order not used before the restart, e.g. "
    "`devices = jax.devices()[::-1]` then `jax.make_mesh(..., devices=devices)` (as "
    "notebook 03 does), or %jaxsys restart for the whole world."
)
#: Seconds the processes have to list their names after a rejoin.
NAMES_TIMEOUT = 5.0
#: Names listed in a message; more are counted.
NAMES_SHOWN = 12
#: The kernel reads at most this many names per process, each at most this long.
NAMES_READ = 2000
NAME_LENGTH = 100


def rejoin_refusal(cluster, rank: int) -> str | None:
    """Why process ``rank`` cannot come back alone (None when ``%jaxsys restart P`` can)."""
    try:
        cluster._check_rank_restart(rank)
    except ClusterError as e:
        return str(e)
    return None


def kill_guidance(cluster, rank: int) -> str:
    """The sentence after a kill that says what brings the program back."""
    if rank == 0:
        return (
            "Process 0 hosts JAX's coordination service: the others end with it, and it "
            "cannot come back alone. %jaxsys restart restarts the whole world. " + WORLD_LOST
        )
    refusal = rejoin_refusal(cluster, rank)
    if refusal is not None:
        return (
            f"It cannot come back alone ({refusal}): %jaxsys restart restarts the whole world. "
            + WORLD_LOST
        )
    return (
        f"The others keep running: JAX declares it dead after {cluster.heartbeat_timeout:g} s "
        "without heartbeats, and live_devices then leaves out its devices. To bring it back: "
        f"%jaxsys restart {rank} (it starts empty; the restart says what to rebuild and what a "
        "collective needs), or %jaxsys restart for the whole world."
    )


def _names(values: object) -> set[str]:
    """An engine's answer, bounded: only short strings count (it is untrusted input)."""
    if not isinstance(values, list | tuple):
        return set()
    return {v for v in values[:NAMES_READ] if isinstance(v, str) and 0 < len(v) <= NAME_LENGTH}


def missing_names(cluster, rank: int) -> list[str] | None:
    """The names the other live processes hold that process ``rank`` lacks, sorted.

    None when the processes could not be asked (the message then says so).
    """
    try:
        live = [r for r in cluster.ranks if cluster.processes[r].state == "ready"]
        calls = cluster.call(live, probes.user_names, timeout=NAMES_TIMEOUT)
    except Exception:  # noqa: BLE001 - the list is advice; the restart itself succeeded
        return None
    if rank not in calls.results:
        return None
    others = [_names(v) for r, v in calls.results.items() if r != rank]
    held = set().union(*others) if others else set()
    return sorted(held - _names(calls.results[rank]))


def rejoin_lines(cluster, rank: int) -> list[str]:
    """What the user is told after ``%jaxsys restart P``: P starts empty, what it lacks,
    and what a collective needs on this platform."""
    missing = missing_names(cluster, rank)
    if missing is None:
        lacks = "(the processes did not list their names in time)"
    elif not missing:
        lacks = "(the others hold no names it lacks)"
    else:
        shown = ", ".join(missing[:NAMES_SHOWN])
        more = f" and {len(missing) - NAMES_SHOWN} more" if len(missing) > NAMES_SHOWN else ""
        lacks = f"and lacks {shown}{more}, which the others hold"
    lines = [
        f"Process {rank} starts empty {lacks}: rebuild them with %%multihost --procs {rank}, "
        "or %jaxsys restart for the whole world."
    ]
    processes = getattr(cluster, "processes", None) or {}
    if rank in range(len(processes)) and getattr(processes[rank], "platform", None) == "cpu":
        lines.append(CPU_COLLECTIVE)
    return lines
