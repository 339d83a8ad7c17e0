"""The pid-reuse guard of teardown: a pid is signalled only while it names the process the
cluster started."""

from __future__ import annotations

import os

import pytest

from jaxsys_kernel.cluster.records import ProcessInfo
from jaxsys_kernel.cluster.teardown import START_TIME_TOLERANCE_S, start_time, still_ours

from .free_pid import free_pid


def test_a_pid_is_ours_only_while_its_start_time_matches():
    me = os.getpid()
    started = start_time(me)
    assert started is not None
    assert still_ours(me, started)
    # The same pid held by a process that started later: a reused pid.
    assert not still_ours(me, started + 10 * START_TIME_TOLERANCE_S)
    assert not still_ours(me, started - 3600.0)


def test_without_a_start_time_only_a_child_is_ours():
    # This process is not its own child: a pid recorded without a start time that now
    # names an unrelated process is left alone.
    assert not still_ours(os.getpid())
    assert not still_ours(os.getppid())


def test_a_pid_nobody_holds_may_be_signalled():
    # Its group, if any is left, is still the original's: Linux does not reuse the id.
    assert still_ours(free_pid(), 123.0)
    assert start_time(free_pid()) is None


@pytest.mark.parametrize("reported", [float("nan"), float("inf"), "123", True, None, [1]])
def test_a_start_time_an_engine_reports_is_checked(reported):
    info = {"engine_id": 0, "pid": 10, "host": "h", "address": "a", "nanny_pid": None}
    assert ProcessInfo.from_description(0, {**info, "started": reported}).started is None
    assert ProcessInfo.from_description(0, {**info, "started": 5}).started == 5.0
    # Not a column of the status rows.
    assert "started" not in ProcessInfo.from_description(0, info).to_dict()
