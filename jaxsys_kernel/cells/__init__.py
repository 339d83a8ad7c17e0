"""The ``%%multihost`` cell path, independent of IPython magics.

- ``run``: :class:`CellMachine`, one cell as a state machine fed events and a clock;
- ``hang``: the ``--on-hang`` policy; ``report``: the hang report;
- ``send``: the thin sender over ipyparallel and the loop that drives a cell;
- ``guard``: checks before a cell is sent, and the same-program guard;
- ``result``: what a cell produced and the errors it ends in; ``sink``: where output goes;
- ``collate``: merging the processes' lines.
"""

from __future__ import annotations

from .result import (
    INTERRUPT_GRACE,
    CellResult,
    CellRun,
    MultihostError,
    MultihostHang,
    MultihostInterrupt,
    MultihostTimeout,
    ProcResult,
    cell_result,
    group_errors,
    interrupt_summary,
    raise_for_run,
    render_errors,
    strip_ansi,
)
from .run import NATIVE_NOISE, CellMachine, Step
from .send import execute
from .sink import Sink

__all__ = [
    "INTERRUPT_GRACE",
    "NATIVE_NOISE",
    "CellMachine",
    "CellResult",
    "CellRun",
    "MultihostError",
    "MultihostHang",
    "MultihostInterrupt",
    "MultihostTimeout",
    "ProcResult",
    "Sink",
    "Step",
    "cell_result",
    "execute",
    "group_errors",
    "interrupt_summary",
    "raise_for_run",
    "render_errors",
    "strip_ansi",
]
