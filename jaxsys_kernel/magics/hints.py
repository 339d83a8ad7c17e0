"""Hints where Python's or JAX's own words mislead a jaxsys user.

A name defined by a cell run on some processes only (``--procs 0``) raises ``NameError`` on
the others, and nothing in that error says why: :class:`PartialNames` remembers which cell
defined which names where, and adds the reason to such an error.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Collection, Sequence

from .._ranges import format_procs

#: JAX's words when a process asks for the values of an array spanning processes.
NON_ADDRESSABLE = "spans non-addressable"
PULL_HINT = (
    "this array spans processes, so no one process holds its values; %pull NAME (in a cell "
    "of its own) brings the whole array to the kernel, or "
    "multihost_utils.process_allgather(x) gathers it on every process"
)
#: Names remembered at most (the oldest are forgotten first).
REMEMBERED = 5000
_UNDEFINED = re.compile(r"name '([A-Za-z_][A-Za-z0-9_]*)' is not defined")


@functools.lru_cache(maxsize=64)
def defined_names(code: str) -> frozenset[str]:
    """The names a cell binds at its top level (assignments, imports, def and class)."""
    # Kept by the cell's text: every cell is parsed before it runs, and a notebook runs
    # the same few cells again and again.
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return frozenset()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        else:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
    return frozenset(names - {"*"})


class PartialNames:
    """Which names a cell run on some processes only defined, on which processes."""

    def __init__(self):
        self.where: dict[str, tuple[tuple[int, ...], str]] = {}

    def reset(self) -> None:
        """Every process starts afresh (after a world restart)."""
        self.where = {}

    def record(
        self, ranks: Sequence[int], all_ranks: Collection[int], code: str, label: str | None
    ) -> None:
        """Remember what a cell about to run on ``ranks`` defines (a cell on every process
        defines its names everywhere)."""
        names = defined_names(code)
        if set(ranks) == set(all_ranks):
            for name in names:
                self.where.pop(name, None)
            return
        for name in names:
            self.where.pop(name, None)  # re-inserted last: the newest are kept longest
            self.where[name] = (tuple(sorted(ranks)), label or "an earlier cell")
        while len(self.where) > REMEMBERED:
            self.where.pop(next(iter(self.where)))

    def hint(self, rank: int, evalue: str) -> str | None:
        """Why ``name '...' is not defined`` on ``rank``, if a partial cell explains it."""
        match = _UNDEFINED.search(evalue or "")
        if match is None or match.group(1) not in self.where:
            return None
        ranks, label = self.where[match.group(1)]
        if rank in ranks:
            return None
        return (
            f"{match.group(1)} was defined only on {format_procs(list(ranks))}, by cell {label}; "
            f"run that cell on this process too (--procs), or on every process"
        )

    def explain_run(self, run) -> None:
        """Add a hint to each error in ``run`` whose own words mislead: a ``NameError`` a
        partial cell explains, or JAX refusing to fetch an array spanning processes."""
        for rank in run.procs:
            error = run.results[rank].error
            if not error:
                continue
            evalue = str(error.get("evalue", ""))
            said = None
            if error.get("ename") == "NameError":
                said = self.hint(rank, evalue)
            elif NON_ADDRESSABLE in evalue:
                said = PULL_HINT
            if said:
                # After the traceback, whose last line is Python's own words.
                error["traceback"] = [*(error.get("traceback") or []), f"jaxsys: {said}"]


# -- cells that run where the user did not mean them to ----------------------------------------

_JAX_USE = re.compile(r"^\s*(?:import|from)\s+jax\b|\bjax\.\w|\bjnp\.\w", re.MULTILINE)
_SINGLE = re.compile(r"^\s*%multihost\b(?P<rest>[^\n]*)\n(?P<body>.*)\Z", re.DOTALL)

#: Said once per session, after the first kernel-side cell that uses JAX beside a cluster.
KERNEL_JAX = (
    "jaxsys: this cell ran in the kernel, whose JAX sees only its own CPU, not the cluster's "
    "{n} processes: start it with %%multihost to run it on every process, or turn on SPMD "
    "mode (%multihost on) to run every cell there."
)


def single_percent_refusal(line_options: str) -> str:
    """What a cell starting with ``%multihost`` (one %) and code after it is told."""
    return (
        f"nothing ran: %multihost{line_options} is a line magic, so the code below it would "
        "have run in the kernel, not on the processes. Did you mean %%multihost (two %) to "
        "run this cell on every process? (%multihost on|off goes on a line of its own.)"
    )


def refuse_single_percent(line_options: str) -> None:
    """Raise the :func:`single_percent_refusal` (the transformed cell calls this)."""
    # Deferred: IPython's error is only needed when a cell is refused.
    from IPython.core.error import UsageError

    raise UsageError(single_percent_refusal(line_options))


def single_percent_transformer(lines: list[str]) -> list[str]:
    """Turn a cell of ``%multihost [...]`` followed by code into one that runs nothing and
    asks whether ``%%multihost`` was meant."""
    match = _SINGLE.match("".join(lines))
    if match is None or not match.group("body").strip():
        return lines
    rest = match.group("rest").rstrip()
    return [f"__import__('{__name__}', fromlist=['_']).refuse_single_percent({rest!r})\n"]


class KernelJaxHint:
    """After a cell that used JAX in the kernel while a cluster runs: one line, once."""

    def __init__(self, session):
        self.session = session
        self.told = False

    def after_cell(self, result) -> None:
        """A ``post_run_cell`` hook: print :data:`KERNEL_JAX` if this cell is the first such."""
        if self.told:
            return
        try:
            code = result.info.raw_cell or ""
            cluster = self.session.cluster
            running = cluster is not None and cluster.state == "ready"
        except Exception:  # noqa: BLE001 - a hint must never fail the user's cell
            return
        first = next((line.strip() for line in code.splitlines() if line.strip()), "")
        if not running or self.session.spmd or first.startswith("%"):
            return
        if _JAX_USE.search(code):
            self.told = True
            print(KERNEL_JAX.format(n=cluster.nprocs))
