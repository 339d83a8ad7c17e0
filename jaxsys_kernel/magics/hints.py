"""Hints where Python's or JAX's own words mislead a jaxsys user.

A name defined by a cell run on some processes only (``--procs 0``) raises ``NameError`` on
the others, and nothing in that error says why: :class:`PartialNames` remembers which cell
defined which names where, and adds the reason to such an error.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Sequence

from .._ranges import format_procs

#: Names remembered at most (the oldest are forgotten first).
REMEMBERED = 5000
_UNDEFINED = re.compile(r"name '([A-Za-z_][A-Za-z0-9_]*)' is not defined")


def defined_names(code: str) -> set[str]:
    """The names a cell binds at its top level (assignments, imports, def and class)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
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
    return names - {"*"}


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
        """Add the hint to each ``NameError`` in ``run`` that a partial cell explains."""
        for rank in run.procs:
            error = run.results[rank].error
            if not error or error.get("ename") != "NameError":
                continue
            said = self.hint(rank, str(error.get("evalue", "")))
            if said:
                # After the traceback, whose last line is Python's own words.
                error["traceback"] = [*(error.get("traceback") or []), f"jaxsys: {said}"]
