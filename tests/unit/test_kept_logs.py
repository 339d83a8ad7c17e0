"""A failed start's engine logs outlive its profile, one set per owner, and go with the owner."""

from __future__ import annotations

import os

import pytest

from jaxsys_kernel import contract
from jaxsys_kernel.cluster.profile import (
    keep_logs,
    kept_logs,
    make_profile,
    remove_profile,
    remove_stale_profiles,
)

from .free_pid import free_pid

pytestmark = pytest.mark.unit


def test_the_logs_move_beside_the_profile_and_replace_the_owners_earlier_ones(tmp_path):
    first, second = make_profile(tmp_path), make_profile(tmp_path)
    (first / "log" / "ipengine-0.log").write_text("first start\n")
    (second / "log" / "ipengine-0.log").write_text("second start\n")
    kept = keep_logs(first)
    assert kept == kept_logs(first) and kept.parent == tmp_path
    assert kept.name.startswith(f"{contract.START_LOGS_PREFIX}{os.getpid()}-")
    assert kept.stat().st_mode & 0o077 == 0
    remove_profile(first)
    assert (kept / "ipengine-0.log").read_text() == "first start\n"
    # The same owner's next failed start keeps its own logs in their place.
    assert (keep_logs(second) / "ipengine-0.log").read_text() == "second start\n"
    assert not kept.exists()
    remove_profile(second)


def test_a_profile_without_logs_keeps_nothing(tmp_path):
    profile = make_profile(tmp_path)
    (profile / "log").rmdir()
    assert keep_logs(profile) is None
    assert not kept_logs(profile).exists()
    remove_profile(profile)


def test_a_later_start_removes_the_logs_of_an_owner_that_is_gone(tmp_path):
    dead = tmp_path / f"{contract.START_LOGS_PREFIX}{free_pid()}-abc"
    mine = tmp_path / f"{contract.START_LOGS_PREFIX}{os.getpid()}-def"
    dead.mkdir()
    mine.mkdir()
    assert remove_stale_profiles(tmp_path) == [dead]
    assert mine.is_dir()
