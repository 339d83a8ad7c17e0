"""Fixtures: one tagged cluster or kernel per module, and a census after each module."""

from __future__ import annotations

import os

import pytest

from .harness import TAG_VAR, kernel_with_cluster, new_tag, wait_no_processes


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
