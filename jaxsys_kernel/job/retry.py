"""``jaxsys job --retries N``: a job that failed is run again, up to N times.

A run that ends badly (a cell failed, a process died, the timeout passed) is run again
from the start of the program; the program resumes from its own checkpoint, which lives in
the job's folder (relative paths there are kept between runs and between submissions: the
folder is never emptied). Each earlier run's collated log is kept as ``job.K.log``. A job
stopped by its user (SIGINT or SIGTERM to ``jaxsys job``) is not run again.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import ConfigError
from .owner import _SIGNALS
from .run import JobResult

#: The most reruns a job may ask for.
MAX_RETRIES = 100
#: How a run stopped by its user ends (see :mod:`.owner`): never rerun.
_STOPPED_BY_USER = tuple(why for why, _code in _SIGNALS.values())


def check_retries(retries: int) -> None:
    """Refuse a rerun count outside ``0..MAX_RETRIES``."""
    if not 0 <= retries <= MAX_RETRIES:
        raise ConfigError(
            f"--retries must be a whole number from 0 to {MAX_RETRIES}, got {retries}"
        )


def run_with_retries(run: Callable[[], JobResult], out: Path, retries: int) -> JobResult:
    """Call ``run`` (one whole run of the job) until it succeeds, at most ``retries`` more
    times after the first; returns the last run's result.

    Parameters
    ----------
    run
        Runs the job once and writes ``out/job.log`` (:func:`.run.run_job`).
    out
        The job's folder.
    retries
        How many times a failed run is run again.
    """
    check_retries(retries)
    for attempt in range(retries + 1):
        t0 = time.monotonic()
        result = run()
        took = time.monotonic() - t0
        if not result.exit_code or attempt == retries:
            break
        if result.ending.startswith(_STOPPED_BY_USER):
            break
        kept = out / f"job.{attempt + 1}.log"
        (out / "job.log").replace(kept)
        print(
            f"jaxsys job: run {attempt + 1} ended after {took:.1f} s: {result.ending}; "
            f"its log is {kept.name}; running the job again (retry {attempt + 1} of {retries})",
            file=sys.stderr,
            flush=True,
        )
    if attempt and not result.exit_code:
        print(f"jaxsys job: the job ended ok on retry {attempt} of {retries}", file=sys.stderr)
    return result


__all__ = ["MAX_RETRIES", "check_retries", "run_with_retries"]
