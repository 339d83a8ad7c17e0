"""The hang doctor: what every process of a stuck cell is doing, and where.

Each engine arms ``faulthandler`` on SIGUSR1 at start-up (engine/bootstrap.py), writing to
a stack file of its own; engines on other hosts relay what lands there as telemetry. Dumping stacks therefore works even while a process sits inside a C++
collective with the GIL released, where no Python-level handler could run.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

from .._ranges import format_procs

# A cell's own code runs from a file ipykernel names after the cell.
_USER_FILE = re.compile(r'File "(/tmp/ipykernel_\d+/\d+\.py|<ipython-input-[^"]*>)", line \d+')
# Frames that mean the process is waiting in JAX's dispatch or in a collective.
_JAX_WAIT = re.compile(
    r"/jax/|/jaxlib/|multihost_utils|block_until_ready|_value|psum|all_gather|process_allgather"
)


def dump_stacks(cluster, ranks: list[int], timeout: float = 2.0) -> dict[int, str]:
    """Ask processes for the Python stacks of all their threads, without stopping them.

    Parameters
    ----------
    cluster : jaxsys_kernel.Cluster
    ranks : list of int
        Processes to ask.
    timeout : float
        Seconds to wait for the dumps to appear.

    Returns
    -------
    dict
        The dump text by rank; ranks whose dump did not arrive in time are missing.
    """
    if cluster.launcher != "local":
        return _relayed_stacks(cluster, ranks, max(timeout, 3.0))
    logs = {r: cluster.stack_file(r) for r in ranks}
    logs = {r: p for r, p in logs.items() if p.exists()}
    sizes = {r: p.stat().st_size for r, p in logs.items()}
    cluster.interrupt(list(logs), sig=signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    out: dict[int, str] = {}
    while logs and time.monotonic() < deadline:
        for r, p in list(logs.items()):
            text = _read_from(p, sizes[r])
            # faulthandler ends every dump with the stack of the thread it ran in.
            if "Current thread" in text or "most recent call first" in text:
                time.sleep(0.05)  # the rest of the dump lands within microseconds
                out[r] = _read_from(p, sizes[r])
                del logs[r]
        time.sleep(0.02)
    return out


def _relayed_stacks(cluster, ranks: list[int], timeout: float) -> dict[int, str]:
    """Stacks of processes on other hosts: the signal goes through their nannies, and the
    dumps come back as telemetry."""
    hub = cluster.telemetry
    if hub is None:
        return {}
    before = {r: hub.stack_dump(r)[0] for r in ranks}
    cluster.interrupt(ranks, sig=signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    out: dict[int, str] = {}
    while len(out) < len(ranks) and time.monotonic() < deadline:
        for r in ranks:
            seq, text = hub.stack_dump(r)
            if r not in out and seq > before[r]:
                out[r] = text
        time.sleep(0.02)
    return out


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def main_stack(dump: str) -> list[str]:
    """The frames of the thread that runs cells (the one faulthandler calls current)."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", "\n" + dump)
    for block in blocks:
        if block.startswith("Current thread"):
            return [ln for ln in block.splitlines()[1:] if ln.strip()]
    return [ln for ln in (blocks[-1] if blocks else "").splitlines()[1:] if ln.strip()]


def annotate(frames: list[str]) -> list[str]:
    """Mark user frames ``>>`` and JAX dispatch/collective frames ``**``."""
    marked = []
    for ln in frames:
        if _USER_FILE.search(ln):
            marked.append(">> " + ln.strip())
        elif _JAX_WAIT.search(ln):
            marked.append("** " + ln.strip())
        else:
            marked.append("   " + ln.strip())
    return marked


def waits_in_jax(frames: list[str]) -> bool:
    """Whether the innermost frames are JAX's (dispatch, a blocking wait, a collective)."""
    return any(_JAX_WAIT.search(ln) for ln in frames[:3])


def waiting_in_jax(stacks: dict[int, str], ranks: list[int]) -> list[bool]:
    """For each rank, whether it waits inside JAX; a missing stack counts as yes (be safe)."""
    out = []
    for r in ranks:
        frames = main_stack(stacks.get(r, ""))
        out.append(not frames or waits_in_jax(frames))
    return out


def report(run, stacks: dict[int, str], reason: str, max_frames: int = 12) -> str:
    """Text of the diagnosis: what every process did, and the stacks of the stuck ones.

    Parameters
    ----------
    run : executor.CellRun
        The cell so far.
    stacks : dict
        Dumps by rank, from :func:`dump_stacks`.
    reason : str
        Why the cell is judged hung, one sentence.
    """
    lines = [f"jaxsys hang doctor: {reason}"]
    for r in run.procs:
        res = run.results[r]
        if r in run.stuck:
            state = "still running"
        elif res.status == "ok":
            state = "finished"
        elif res.error:
            state = f"raised {res.error.get('ename')}: {res.error.get('evalue')}"
        else:
            state = res.status
        lines.append(f"  {format_procs([r])}: {state}")
        if r in run.stuck:
            frames = main_stack(stacks.get(r, ""))
            if not frames:
                lines.append("      (no stack: the process did not answer SIGUSR1)")
                continue
            marked = annotate(frames)
            # Innermost frames down to the user's own line; the engine's machinery below
            # it says nothing about the hang.
            user = next((i for i, f in enumerate(marked) if f.startswith(">>")), None)
            shown = marked[: user + 1] if user is not None else marked[:max_frames]
            if user is not None and len(shown) > max_frames:
                shown = [
                    *shown[: max_frames - 2],
                    f"   ... {len(shown) - max_frames + 1} more",
                    shown[-1],
                ]
            lines.extend("      " + f for f in shown)
    lines.append("  (>> your code, ** JAX dispatch or collective; innermost frame first)")
    return "\n".join(lines)


def world_broken_message(reason: str) -> str:
    """The error a cell gets while the JAX world is out of step."""
    return (
        f"the JAX world is out of step ({reason}). On CPU an interrupted or abandoned "
        "collective cannot be cancelled, so the next collective would hang: run "
        "%jaxsys restart (a few seconds), or add --force if this cell runs no collective"
    )
