"""Imports sit at module level; one inside a function says why it waits.

docs/architecture.md: each deferred import carries its reason, in a comment that starts with
``Deferred`` on the import's line or in the comment just above it (one comment may cover a
run of imports that wait for the same reason).
"""

from __future__ import annotations

import ast
import re

from .package_source import ROOT, source_files, text, tree

MARKER = "Deferred"

_IMPORT_LINE = re.compile(r"\s*(import |from \S+ import )")


def _explained(lines: list[str], node: ast.stmt) -> bool:
    if MARKER in lines[node.lineno - 1]:
        return True
    i = node.lineno - 2
    while i >= 0 and _IMPORT_LINE.match(lines[i]):
        i -= 1
    while i >= 0 and lines[i].lstrip().startswith("#"):
        if MARKER in lines[i]:
            return True
        i -= 1
    return False


def unexplained_imports(source: str, parsed: ast.Module | None = None) -> list[int]:
    """Line numbers of the imports inside functions that give no reason for waiting
    (``parsed``: the tree of ``source``, when it is parsed already)."""
    lines = source.splitlines()
    found = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import | ast.ImportFrom):
                if not _explained(lines, child):
                    found.append(child.lineno)
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            walk(child, inside)

    walk(parsed or ast.parse(source), False)
    return found


def test_every_import_in_a_function_says_why_it_waits():
    strays = []
    for path in source_files():
        for line in unexplained_imports(text(path), tree(path)):
            code = text(path).splitlines()[line - 1].strip()
            strays.append(f"{path.relative_to(ROOT)}:{line} {code}")
    assert not strays, (
        f"imports inside functions without a '# {MARKER}: <reason>' comment (move them to "
        f"module level, or say why they wait): {strays}"
    )


def test_the_check_finds_a_silent_import_and_accepts_a_reason():
    source = """
import os


def silent():
    import json


def inline():
    import json  # Deferred: only this function needs it.


def above():
    # Deferred: the reason can take
    # two lines.
    import json
    from os import path


def nested():
    def inner():
        import json
    return inner


class Holder:
    def method(self):
        # A comment that gives no reason.
        import json
"""
    assert unexplained_imports(source) == [6, 22, 29]
