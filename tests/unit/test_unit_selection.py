"""`pytest -m unit` collects only tests/unit/: the other folders are left unread, not imported
to deselect every test in them."""

from __future__ import annotations

from types import SimpleNamespace

from ..conftest import _HERE as TESTS
from ..conftest import pytest_ignore_collect


def _config(markexpr: str):
    return SimpleNamespace(getoption=lambda name: markexpr if name == "markexpr" else None)


def test_the_unit_marker_alone_leaves_the_live_and_browser_folders_unread():
    unit = _config("unit")
    assert pytest_ignore_collect(TESTS / "live", unit) is True
    assert pytest_ignore_collect(TESTS / "browser" / "test_x.py", unit) is True
    assert pytest_ignore_collect(TESTS / "unit" / "test_x.py", unit) is None
    # Files beside the folders (the harness, the fakes) are pytest's to decide.
    assert pytest_ignore_collect(TESTS / "harness.py", unit) is None


def test_any_other_selection_collects_every_folder():
    for markexpr in ("", "live", "unit or live", "not browser"):
        assert pytest_ignore_collect(TESTS / "live", _config(markexpr)) is None, markexpr
