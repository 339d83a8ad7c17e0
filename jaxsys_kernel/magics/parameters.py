"""A notebook's parameters reach every process.

papermill (``papermill NB OUT -k jaxsys -p steps 3``) runs the cell it injects as a plain
cell, in the kernel: ``%%multihost`` cells would then fail with a ``NameError`` on every
process. The cell carries no tag by the time it reaches the kernel (nbclient sends the
source alone), but papermill opens it with the comment ``# Parameters``. So a kernel-side
cell that begins with that comment is a parameters cell: the names it assigns are pushed,
with their values, to every process of the cluster, now if it is ready, else before the
first cell that runs once it is (and again to any process that joins later, as a restarted
one does). A notebook's own ``parameters`` cell that starts with the same comment reaches the
processes in the same way.
"""

from __future__ import annotations

import ast
import sys

# What papermill writes as the injected cell's first line (its ``comment`` argument).
MARKER = "# Parameters"
# Seconds every process has to take the values.
PUSH_TIMEOUT = 30.0


def is_parameters_cell(source: str) -> bool:
    """Whether ``source`` is a parameters cell: its first line is ``# Parameters``."""
    first = source.lstrip().partition("\n")[0].strip()
    return first.lower() == MARKER.lower()


def assigned_names(source: str) -> list[str]:
    """The names a cell's top-level assignments bind, in order (empty if it does not parse).

    Examples
    --------
    >>> assigned_names("# Parameters\\nsteps = 3\\nlr, seed = 0.1, 0\\n")
    ['steps', 'lr', 'seed']
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name) and leaf.id not in names:
                    names.append(leaf.id)
    return names


class Parameters:
    """The parameters a notebook set in the kernel, and the processes that have them.

    Parameters
    ----------
    session : MultihostSession
        Its ``shell`` holds the values; its ``cluster`` receives them.
    """

    def __init__(self, session):
        self.session = session
        self.values: dict = {}
        # (engine id, pid) of each process that holds the current values.
        self.delivered: set[tuple[int, int]] = set()

    def after_cell(self, result) -> None:
        """``post_run_cell``: take the values of a parameters cell that ran in the kernel."""
        source = getattr(getattr(result, "info", None), "raw_cell", "") or ""
        if not is_parameters_cell(source) or self.session.spmd:
            return
        if getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None):
            return
        ns = self.session.shell.user_ns
        taken = {n: ns[n] for n in assigned_names(source) if n in ns}
        if taken:
            self.values.update(taken)
            self.delivered.clear()
            self.deliver()

    def before_cell(self, _info=None) -> None:
        """``pre_run_cell``: give the values to processes of a ready cluster that lack them."""
        if self.values:
            self.deliver()

    def deliver(self) -> None:
        """Push the values to every ready process that does not hold them yet."""
        cluster = self.session.cluster
        if cluster is None or cluster.state != "ready":
            return
        wanting = {
            p.rank: (p.engine_id, p.pid)
            for p in cluster.processes
            if p.state == "ready" and p.engine_id is not None
        }
        # A process still busy with an earlier cell would hold the push (and this cell) up:
        # it gets the values before a later cell, once it is free.
        busy = getattr(self.session, "still_running", set())
        wanting = {
            r: ident
            for r, ident in wanting.items()
            if ident not in self.delivered and r not in busy
        }
        if not wanting:
            return
        ranks = sorted(wanting)
        failed: dict[int, str] = {}
        try:
            view = cluster.client[[wanting[r][0] for r in ranks]]
            view.push(dict(self.values), block=False).get(timeout=PUSH_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - told to the user, never fatal to the cell
            failed = {r: f"{type(e).__name__}: {e}" for r in ranks}
        if failed:
            names = ", ".join(sorted(self.values))
            print(
                f"jaxsys: the notebook's parameters ({names}) did not reach the processes "
                f"({next(iter(failed.values()))}); set them in a %%multihost cell instead",
                file=sys.stderr,
            )
        # Told once: a failed push is not tried again before every cell.
        self.delivered.update(wanting.values())


__all__ = ["MARKER", "Parameters", "assigned_names", "is_parameters_cell"]
