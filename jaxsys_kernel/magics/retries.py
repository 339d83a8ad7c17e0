"""``%%multihost --retries N``: a cell that outlives the failure of its processes.

When a process of the cell dies (SIGKILL, a crash, or a preemption that ended it) or the
hang policy names processes stuck, the JAX world is restarted (from the warm standby where
there is one) and the same cell is sent again, up to N times. Each time one line says what
happened, to whom, and how long each phase took: until the failure was known, the world's
restart, and the cell sent again. An error in the cell's own code, on processes that are
alive and free, is the program's answer: it is not retried, nor is a cell the user stopped.

The cell must restore its own progress: a training loop resumes from its latest checkpoint
(``jaxsys_kernel.examples.train`` does). Names defined by earlier cells are gone with the
old processes, so the cell imports and defines what it needs itself.
"""

from __future__ import annotations

import sys
import time

from IPython.core.error import UsageError

from .._ranges import format_procs
from ..cells import MultihostError
from . import training_watch

#: The most retries a cell may ask for: each one restarts the whole JAX world.
MAX_RETRIES = 100


def check_retries(retries: int) -> None:
    """Refuse a retry count outside ``0..MAX_RETRIES``, saying what to pass."""
    if not 0 <= retries <= MAX_RETRIES:
        raise UsageError(f"--retries must be a whole number from 0 to {MAX_RETRIES}, got {retries}")


def fault(cluster, run) -> str | None:
    """What ended a failed cell that a world restart can cure, or None (the cell's own error).

    Parameters
    ----------
    cluster
        The session's cluster, whose process records say how a process died.
    run : CellRun
        The failed cell's run.
    """
    dead = run.by_status("dead")
    if dead:
        how = []
        for r in dead:
            died = getattr(cluster.processes[r], "died", None) if cluster is not None else None
            how.append(f"process {r} died" + (f" ({died})" if died else ""))
        return "; ".join(how)
    if run.hang and run.stuck:
        return f"{format_procs(run.stuck)} named stuck ({run.hang})"
    return None


def run_with_retries(session, code: str, procs, options: dict, retries: int):
    """Run ``code`` as ``session.run_cell`` does, restarting the world and running it again
    after a curable failure, up to ``retries`` times.

    While it runs, the steps the program prints (``step N loss L``) are drawn as a chart
    with each fault's outage and recovery (:mod:`.training_watch`).

    Returns
    -------
    CellResult or None
        The result of the run that succeeded.
    """
    check_retries(retries)
    with training_watch.watching() as chart:
        return _attempts(session, code, procs, options, retries, chart)


def _attempts(session, code: str, procs, options: dict, retries: int, chart):
    first = time.monotonic()
    for attempt in range(retries + 1):
        started = time.monotonic()
        if attempt:
            chart.log.attempt()
        try:
            result = session.run_cell(code, procs, **options)
        except MultihostError as e:
            what = fault(session.cluster, e.run)
            if what is None or attempt == retries:
                raise
            detected = time.monotonic() - started
            dead = e.run.by_status("dead")
            chart.log.failed(what, "dead" if dead else "stuck", dead or e.run.stuck)
            _restart_and_say(session, e.run, what, detected, attempt + 1, retries)
            chart.log.restarted()
            chart.draw(force=True)
            continue
        if attempt:
            print(
                f"jaxsys: the cell ended ok on retry {attempt} of {retries}, "
                f"{time.monotonic() - first:.1f} s after it was first sent",
                file=sys.stderr,
            )
        return result
    raise AssertionError("unreachable: the last attempt returns or raises")


def _restart_and_say(session, run, what: str, detected: float, attempt: int, retries: int):
    """Restart the world (unless the hang policy just did) and say each phase's time."""
    t0 = time.monotonic()
    if run.hang_action == "restart":
        restarted = "the world was restarted by --on-hang restart"
    else:
        took = session.restart()
        restarted = f"world restarted in {took:.1f} s"
    resend = time.monotonic() - t0
    print(
        f"jaxsys: --retries: {what}; known {detected:.1f} s into the cell; {restarted}; "
        f"cell sent again {resend:.1f} s after the failure was known "
        f"(retry {attempt} of {retries})",
        file=sys.stderr,
        flush=True,
    )


__all__ = ["MAX_RETRIES", "check_retries", "fault", "run_with_retries"]
