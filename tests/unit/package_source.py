"""The package's source files, read and parsed once for the tests that scan all of them.

Several tests read every module of ``jaxsys_kernel`` (sizes, deferred imports, requests to
engines, imports of engine modules); parsing the package takes about a third of a second,
so each file is parsed once per run. The trees are shared: a test must not change them.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import jaxsys_kernel

PACKAGE = Path(jaxsys_kernel.__file__).parent
ROOT = PACKAGE.parent


@functools.cache
def source_files() -> tuple[Path, ...]:
    """Every ``.py`` file of the package, sorted."""
    return tuple(sorted(PACKAGE.rglob("*.py")))


@functools.cache
def text(path: Path) -> str:
    """The file's text."""
    return path.read_text()


@functools.cache
def tree(path: Path) -> ast.Module:
    """The file's syntax tree (shared: read it, never change it)."""
    return ast.parse(text(path))
