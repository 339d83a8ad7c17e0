"""``jaxsys job --retries``: which runs are run again, and what is kept of each."""

from __future__ import annotations

import pytest

from jaxsys_kernel.errors import ConfigError
from jaxsys_kernel.job import retry
from jaxsys_kernel.job.run import JobResult

pytestmark = pytest.mark.unit


def runs(out, *results: JobResult):
    """A job whose runs end as ``results`` in turn, each writing its own log."""
    left = list(results)
    count = []

    def run():
        count.append(1)
        (out / "job.log").write_text(f"run {len(count)}\n")
        return left.pop(0)

    return run, count


def test_a_failed_run_is_run_again_and_its_log_kept(tmp_path, capsys):
    run, count = runs(
        tmp_path, JobResult("", exit_code=1, ending="p1 died of SIGKILL"), JobResult("")
    )
    assert retry.run_with_retries(run, tmp_path, 2).exit_code == 0
    assert len(count) == 2
    assert (tmp_path / "job.1.log").read_text() == "run 1\n"
    assert (tmp_path / "job.log").read_text() == "run 2\n"
    err = capsys.readouterr().err
    assert "run 1 ended after" in err and "p1 died of SIGKILL" in err and "retry 1 of 2" in err


def test_the_last_failure_is_returned_once_retries_are_spent(tmp_path):
    failed = JobResult("", exit_code=1, ending="cell 1 failed on p0")
    run, count = runs(tmp_path, failed, failed)
    assert retry.run_with_retries(run, tmp_path, 1).exit_code == 1
    assert len(count) == 2


@pytest.mark.parametrize("why", ["interrupted (SIGINT)", "terminated"])
def test_a_job_its_user_stopped_is_not_run_again(tmp_path, why):
    run, count = runs(tmp_path, JobResult("", exit_code=130, ending=why))
    assert retry.run_with_retries(run, tmp_path, 3).exit_code == 130
    assert len(count) == 1


def test_a_count_out_of_range_is_refused():
    with pytest.raises(ConfigError, match="--retries must be a whole number from 0"):
        retry.check_retries(-1)
