"""``%%multihost --retries``: which failures are retried, how often, and what is said."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from IPython.core.error import UsageError

from jaxsys_kernel.cells.result import CellRun, MultihostError, ProcResult
from jaxsys_kernel.magics import retries

pytestmark = pytest.mark.unit


def run_of(statuses: dict[int, str], **fields) -> CellRun:
    return CellRun(
        procs=sorted(statuses),
        results={r: ProcResult(r, s) for r, s in statuses.items()},
        **fields,
    )


class Session:
    """Runs fail with the given runs in turn, then succeed; restarts are counted."""

    def __init__(self, failures: list[CellRun]):
        self.failures = list(failures)
        self.sent = 0
        self.restarts = 0
        self.cluster = SimpleNamespace(
            processes=[SimpleNamespace(died=None), SimpleNamespace(died="killed with SIGKILL")]
        )

    def run_cell(self, code, procs, **options):
        self.sent += 1
        if self.failures:
            raise MultihostError(self.failures.pop(0), "failed")
        return "value"

    def restart(self) -> float:
        self.restarts += 1
        return 0.5


def test_a_death_is_retried_and_said_with_who_and_each_phase(capsys):
    session = Session([run_of({0: "error", 1: "dead"})])
    assert retries.run_with_retries(session, "x", None, {}, 2) == "value"
    assert (session.sent, session.restarts) == (2, 1)
    err = capsys.readouterr().err
    assert "process 1 died (killed with SIGKILL)" in err
    assert "known" in err and "world restarted in 0.5 s" in err and "retry 1 of 2" in err
    assert "ended ok on retry 1 of 2" in err


def test_stuck_processes_are_retried():
    session = Session([run_of({0: "error", 1: "running"}, hang="failure", stuck=[1])])
    assert retries.run_with_retries(session, "x", None, {}, 1) == "value"
    assert session.restarts == 1


def test_the_cells_own_error_is_not_retried():
    session = Session([run_of({0: "error", 1: "error"})])
    with pytest.raises(MultihostError):
        retries.run_with_retries(session, "x", None, {}, 3)
    assert (session.sent, session.restarts) == (1, 0)


def test_the_last_failure_is_raised_once_retries_are_spent():
    dead = run_of({0: "error", 1: "dead"})
    session = Session([dead, dead])
    with pytest.raises(MultihostError):
        retries.run_with_retries(session, "x", None, {}, 1)
    assert (session.sent, session.restarts) == (2, 1)


def test_a_restart_by_the_hang_policy_is_not_repeated(capsys):
    session = Session(
        [run_of({0: "running", 1: "running"}, hang="timeout", stuck=[0, 1], hang_action="restart")]
    )
    retries.run_with_retries(session, "x", None, {}, 1)
    assert session.restarts == 0
    assert "restarted by --on-hang restart" in capsys.readouterr().err


@pytest.mark.parametrize("n", [-1, retries.MAX_RETRIES + 1])
def test_a_count_out_of_range_is_refused(n):
    with pytest.raises(UsageError, match="--retries must be a whole number from 0"):
        retries.run_with_retries(Session([]), "x", None, {}, n)
