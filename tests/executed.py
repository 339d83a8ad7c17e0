"""Executed copies of the course notebooks, each made at most once per test session.

The notebook test (tests/live) judges each run; the course site's browser test
(tests/browser) renders the same copies. Whichever asks first executes the notebook and the
other reuses the copy, so no notebook runs twice in one session. The copies are written to
``tests/artifacts/executed/`` and outlive the session for reading, but a later session never
reuses them: it executes again.
"""

from __future__ import annotations

from pathlib import Path

from nbclient.exceptions import CellExecutionError

from jaxsys_kernel.cli import run_notebook

EXECUTED_DIR = Path(__file__).parent / "artifacts" / "executed"
NOTEBOOK_DIR = Path(__file__).parents[1] / "notebooks"

_done: dict[Path, Path] = {}

# The suite's clusters keep no standby (tests/conftest.py); the fault-tolerance notebook, whose
# restarts are what the standby is for, runs with one, as a user's local cluster would.
OVERRIDES = {"03-fault-tolerance.ipynb": {"standby": 4}}


def executed(path: Path) -> Path:
    """The copy of ``path`` executed with the jaxsys kernel in this session.

    A cell that raised is left in the copy, as its error output, for the caller to judge
    (the notebook test fails on errors outside cells tagged ``raises-exception``); a kernel
    that could not start or a cell that timed out raises here.
    """
    path = Path(path).resolve()
    if path not in _done:
        out = EXECUTED_DIR / path.name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.unlink(missing_ok=True)
        try:
            run_notebook(path, output=str(out), timeout=300, overrides=OVERRIDES.get(path.name))
        except CellExecutionError:
            pass  # saved with the error output before raising
        _done[path] = out
    return _done[path]
