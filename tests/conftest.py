"""Markers by folder, no processes in unit tests, and the fixtures shared by the live tests.

A test's kind is where its file sits: ``tests/unit/`` (no processes: pure logic, threads and
loopback sockets at most), ``tests/live/`` (clusters, kernels, Jupyter servers, child
processes, namespace hosts) or ``tests/browser/`` (chromium). Each folder's marker is applied
here, so ``pytest -m unit`` runs the fast part and a new file needs no marker of its own.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from IPython.testing import globalipapp

from .harness import TAG_VAR, kernel_with_cluster, new_tag, wait_no_processes
from .process_guard import NoProcesses
from .timing import pytest_runtest_logreport, pytest_terminal_summary  # noqa: F401 - hooks

#: The folders under tests/ that hold test files; each is also the marker of its tests.
KINDS = ("unit", "live", "browser")

_HERE = Path(__file__).parent


def kind_of(path: Path) -> str | None:
    """The folder (``unit``, ``live`` or ``browser``) a test file sits in, else None."""
    try:
        folder = Path(path).resolve().relative_to(_HERE.resolve()).parts[0]
    except (ValueError, IndexError):
        return None
    return folder if folder in KINDS else None


def pytest_ignore_collect(collection_path, config):
    # `pytest -m unit` (the marker alone) would import every live and browser module only to
    # deselect its tests: a few seconds of the unit run. Any other selection collects all.
    kind = kind_of(collection_path)
    if config.getoption("markexpr") == "unit" and kind is not None and kind != "unit":
        return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        kind = kind_of(item.path)
        if kind is not None:
            item.add_marker(kind)


def _guarded(item):
    """Run one phase of a unit test (setup, call or teardown) with processes refused.

    The phases, not a fixture, are wrapped so that module- and session-scoped fixtures set up
    for a unit test are guarded too.
    """
    if item.get_closest_marker("unit") is None:
        return (yield)
    with NoProcesses(item.nodeid) as guard:
        result = yield
    if guard.attempts:
        # The test caught the ProcessStarted error and went on: it still fails.
        raise AssertionError(
            f"{item.nodeid} tried to start {len(guard.attempts)} process(es): "
            + "; ".join(guard.attempts)
        )
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    return (yield from _guarded(item))


@pytest.fixture(scope="session")
def ipython_shell():
    """IPython's test shell, one for the whole run."""
    return globalipapp.start_ipython() or globalipapp.get_ipython()  # None once started


@pytest.fixture(autouse=True)
def _ipython_shell_first_in_unit_tests(request):
    """The shell is a process-wide singleton: once a plain ``InteractiveShell.instance()``
    exists, IPython's test shell can no longer start. Starting the test shell first makes
    both spellings give the same shell, whichever unit test runs first."""
    if request.node.get_closest_marker("unit") is not None:
        request.getfixturevalue("ipython_shell")


@pytest.fixture(scope="session", autouse=True)
def private_cache_home(tmp_path_factory):
    """Every cluster the suite starts uses a compilation cache of the run's own, empty at the
    start: tests never read or fill the user's cache, and no run depends on an earlier one."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache-home"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


@pytest.fixture(scope="session", autouse=True)
def no_standby_unless_asked():
    """Clusters keep no standby unless a test asks (``standby=N``, ``--standby N``): on two
    cores every cluster's standby would boot as many processes again behind each test."""
    old = os.environ.get("JAXSYS_STANDBY")
    os.environ.setdefault("JAXSYS_STANDBY", "0")
    yield
    if old is None:
        os.environ.pop("JAXSYS_STANDBY", None)


@pytest.fixture(scope="module")
def tag():
    """A tag for this module's processes; after the module none may be left."""
    t = new_tag()
    old = os.environ.get(TAG_VAR)
    os.environ[TAG_VAR] = t
    yield t
    if old is None:
        os.environ.pop(TAG_VAR, None)
    else:
        os.environ[TAG_VAR] = old
    left = wait_no_processes(t, timeout=10)
    assert not left, f"processes left behind: {left}"


@pytest.fixture(scope="module")
def cluster(tag):
    """A started 2-process x 2-device cluster shared by a module."""
    from jaxsys_kernel import Cluster

    c = Cluster(hosts=2, devices_per_host=2, progress=lambda e: None)
    c.start_sync()
    yield c
    c.kill()


@pytest.fixture(scope="module")
def kernel(tag):
    """A jaxsys kernel with a started 2 x 2 cluster, shared by a module."""
    with kernel_with_cluster(tag) as k:
        yield k
