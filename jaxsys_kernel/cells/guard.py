"""Checks before a cell is sent: its options, its processes, and the same-program guard."""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence

from IPython.core.error import UsageError

from .._ranges import format_procs
from .hang import ON_HANG


def check_options(timeout: float | None, grace: float, on_hang: str) -> None:
    """Raise UsageError for a ``--timeout``, ``--grace`` or ``--on-hang`` that cannot work."""
    if timeout is not None and timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {timeout:g}")
    if grace <= 0:
        raise UsageError(f"--grace must be positive, got {grace:g}")
    if on_hang not in ON_HANG:
        raise UsageError(f"--on-hang must be one of {', '.join(ON_HANG)}, got {on_hang!r}")


def check_processes(cluster, ranks: Sequence[int], still_running: Collection[int]) -> None:
    """Raise UsageError if a selected process is dead or still busy with an earlier cell.

    Parameters
    ----------
    cluster : jaxsys_kernel.Cluster
        Its process states are refreshed first.
    ranks : sequence of int
        The processes the cell is for.
    still_running : collection of int
        Processes that outlived an earlier cell (an interrupt could not free them).
    """
    cluster.refresh_states()
    dead = [r for r in ranks if cluster.processes[r].state != "ready"]
    if dead:
        live = [r for r in cluster.ranks if cluster.processes[r].state == "ready"]
        one = len(dead) == 1
        why = "; ".join(
            f"p{r} {cluster.processes[r].state}"
            + (f": {cluster.processes[r].died}" if cluster.processes[r].died else "")
            for r in dead
        )
        if not live or cluster.processes[0].state == "dead":
            # Process 0's death ends the others (they lose the coordination service).
            raise UsageError(
                f"no process is running ({why}); %jaxsys restart restarts the whole world "
                "(every name defined on the processes is gone)"
            )
        raise UsageError(
            f"{format_procs(dead)} {'is' if one else 'are'} not running ({why}); run on "
            f"the others with --procs {format_procs(live)[1:]}, or bring "
            f"{'it' if one else 'them'} back with %jaxsys restart"
        )
    busy = sorted(set(still_running) & set(ranks))
    if busy:
        raise UsageError(
            f"the JAX world is out of step: {format_procs(busy)} still "
            f"{'runs' if len(busy) == 1 else 'run'} an earlier cell that did not stop when "
            "interrupted (stuck inside JAX; a new cell would only queue behind it): "
            "run %jaxsys restart"
        )


class Ledger:
    """The same-program guard: which cells each process ran since they were last in step.

    Every cell is tagged with a hash of its code. A cell run on some processes only
    (``--procs``) is harmless unless it started something the others must join, e.g. a
    collective: then the next cell that reaches all of them deadlocks. Saying so before
    the cell runs names the cause that the hang doctor would otherwise only see.
    """

    def __init__(self):
        self.cells: dict[int, list[str]] = {}

    def reset(self) -> None:
        """Every process starts afresh (after a world restart)."""
        self.cells = {}

    def record(
        self,
        ranks: Sequence[int],
        all_ranks: Collection[int],
        code: str,
        label: str | None = None,
    ) -> str | None:
        """Record a cell about to run on ``ranks``.

        Parameters
        ----------
        label : str, optional
            The cell as the user sees it (``[10] x = f(y)``); a hash of its code without one.

        Returns
        -------
        str or None
            The warning to show when those processes have not run the same cells before it.
        """
        tag = label or "cell " + hashlib.sha256(code.encode()).hexdigest()[:8]
        histories = {r: tuple(self.cells.get(r, ())) for r in ranks}
        warning = None
        if len(set(histories.values())) > 1:
            groups: dict[tuple, list[int]] = {}
            for r, h in histories.items():
                groups.setdefault(h, []).append(r)
            parts = [
                f"{format_procs(rs)} ran {len(h)} cell(s) since the last cell on all of them"
                + (f" ({'; '.join(h[-3:])})" if h else "")
                for h, rs in groups.items()
            ]
            warning = (
                "Warning: these processes are out of step: "
                + "; ".join(parts)
                + f". If one of those cells left a collective half-done, this one ({tag}) will "
                "hang (the hang doctor will say where)."
            )
        if set(ranks) == set(all_ranks):
            self.cells = {}
        else:
            for r in ranks:
                self.cells.setdefault(r, []).append(tag)
        return warning


def cell_label(number: int | None, code: str, width: int = 40) -> str | None:
    """A cell as the notebook shows it: ``[10]`` and its first line of code, shortened."""
    if number is None:
        return None
    first = next((line.strip() for line in code.splitlines() if line.strip()), "")
    if len(first) > width:
        first = first[: width - 3] + "..."
    return f"[{number}] {first}".rstrip()
