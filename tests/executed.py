"""Executed copies of the course notebooks, each made at most once per test session.

The notebook test (tests/live) judges each run; the course site's browser test
(tests/browser) renders the same copies. Whichever asks first executes the notebook and the
other reuses the copy, so no notebook runs twice in one session. The copies are written to
``tests/artifacts/executed/`` and outlive the session for reading, but a later session never
reuses them: it executes again.

A session run by pytest-xdist spans several worker processes, which may ask for the same
notebook at once: a lock file per notebook lets one execute it while the others wait, and a
stamp beside the copy names the run that made it (``PYTEST_XDIST_TESTRUNUID``, the same in
every worker of one run).
"""

from __future__ import annotations

import fcntl
import os
import uuid
from pathlib import Path

from nbclient.exceptions import CellExecutionError

from jaxsys_kernel.cli import run_notebook

EXECUTED_DIR = Path(__file__).parent / "artifacts" / "executed"
NOTEBOOK_DIR = Path(__file__).parents[1] / "notebooks"

_done: dict[Path, Path] = {}
# Outside xdist a session is one process: an id of its own.
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex

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
        stamp = out.with_name(out.name + ".run")
        # Held while the notebook runs: another worker asking for it waits for the copy.
        with open(out.with_name(out.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            made_here = stamp.exists() and stamp.read_text() == _RUN and out.exists()
            if not made_here:
                stamp.unlink(missing_ok=True)
                out.unlink(missing_ok=True)
                try:
                    run_notebook(
                        path, output=str(out), timeout=300, overrides=OVERRIDES.get(path.name)
                    )
                except CellExecutionError:
                    pass  # saved with the error output before raising
                stamp.write_text(_RUN)
        _done[path] = out
    return _done[path]
