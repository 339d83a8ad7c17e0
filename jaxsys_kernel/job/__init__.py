"""``jaxsys job``: a notebook turned into a multi-controller program, run as one job."""

from __future__ import annotations

from .program import Cell, Program, from_notebook, render
from .run import JobResult, collate_outputs, run_job

__all__ = [
    "Cell",
    "JobResult",
    "Program",
    "collate_outputs",
    "from_notebook",
    "render",
    "run_job",
]
