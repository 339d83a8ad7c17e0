"""A process that died, explained: which one, how (its signal or exit code), in which cell as
the notebook numbers it, and the last lines of its log, instead of the client's engine id.

A dead process's native log stays on disk until the cluster stops; where this kernel can
read it (engines on this host), ``%jaxsys logs P`` and a death's explanation read it there.
"""

from __future__ import annotations

from ..cells.run import NATIVE_NOISE
from ..cluster.launchers import native_log_file
from . import recovery

#: Lines of the log a death's explanation shows.
DEATH_TAIL = 8
#: Bytes read from the end of a log (the lines shown come from them).
TAIL_BYTES = 64 * 1024
#: Characters of one log line shown (a log is what an engine wrote: untrusted).
LINE_CHARS = 300
#: The name a death is reported under, in place of the client's ``EngineError``.
DIED = "ProcessDied"


def dead_log(cluster, rank: int, tail: int) -> str | None:
    """The last ``tail`` lines of the native log process ``rank`` left, or None where this
    kernel cannot read it (its host is another, or the cluster keeps no profile)."""
    world = getattr(cluster, "world", None)
    profile = getattr(world, "profile", None)
    if profile is None or tail <= 0:
        return None
    path = native_log_file(profile, rank, world.incarnation)
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read()
    except OSError:
        return None
    lines = data.decode(errors="replace").splitlines()
    if size > TAIL_BYTES:
        lines = lines[1:]  # the first is cut
    # Gloo's connection notices say nothing about a death (cells leave them out too).
    lines = [ln for ln in lines if NATIVE_NOISE.sub("", ln).strip() or not ln.strip()]
    return "".join(line[:LINE_CHARS] + "\n" for line in lines[-tail:])


def explain(cluster, rank: int, cell_number: int | None) -> str:
    """One message for the death of process ``rank`` during the cell numbered ``cell_number``."""
    try:
        cluster.refresh_states()
        how = cluster.processes[rank].died
    except Exception:  # noqa: BLE001 - the explanation must not hide the death itself
        how = ""
    cell = f"cell [{cell_number}]" if cell_number is not None else "the cell"
    said = f"process {rank} died while running {cell}" + (f": {how}" if how else "")
    tail = dead_log(cluster, rank, DEATH_TAIL)
    if tail:
        said += "\nthe last lines of its log (%jaxsys logs " + f"{rank} shows more):\n" + tail
    if rank != 0 and recovery.rejoin_refusal(cluster, rank) is None:
        path = f"%jaxsys restart {rank} brings it back (empty); %jaxsys restart, the whole world"
    else:
        path = "it cannot come back alone: %jaxsys restart restarts the whole world"
    return said.rstrip("\n") + "\n" + path


def explain_run(cluster, run, cell_number: int | None) -> None:
    """Replace the client's words for each death in ``run`` (``EngineError: Engine 1004
    died...``) by :func:`explain`'s."""
    for rank in run.by_status("dead"):
        res = run.results[rank]
        res.error = {"ename": DIED, "evalue": explain(cluster, rank, cell_number), "traceback": []}
