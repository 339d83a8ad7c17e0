"""The spare world's refusals, its memory judgement and its words, without processes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jaxsys_kernel.cluster import spare_world
from jaxsys_kernel.cluster.launchers import LocalLauncher, MpiLauncher, SshLauncher
from jaxsys_kernel.cluster.world import World
from jaxsys_kernel.errors import ConfigError

pytestmark = pytest.mark.unit

MB = 2**20


def _made(kind, wanted):
    return spare_world.for_launcher(SimpleNamespace(spare_world=wanted), kind.__new__(kind))


def test_only_local_clusters_keep_a_spare_world_and_only_when_asked():
    assert _made(LocalLauncher, True).enabled
    assert not _made(LocalLauncher, False).enabled
    assert not _made(MpiLauncher, False).enabled
    with pytest.raises(ConfigError, match="the mpi launcher cannot keep a spare world"):
        _made(MpiLauncher, True)
    with pytest.raises(ConfigError, match="--spare-world off"):
        _made(SshLauncher, True)


def test_the_status_line_says_off_refilling_or_ready_with_its_processes():
    sw = spare_world.SpareWorld(False)
    assert sw.line().startswith("spare world: off (%jaxsys start --spare-world")
    sw = spare_world.SpareWorld(True)
    assert sw.line() == "spare world: off"
    sw.state, sw.engines = "filling", {0: object(), 1: object()}
    assert sw.line() == "spare world: refilling, 2 processes launched, joining"
    sw.state = "ready"
    sw.infos = {0: {"pid": 41}, 1: {"pid": 42}}
    assert sw.line() == "spare world: ready, 2 processes joined (pids 41, 42)"
    # What an engine reported is untrusted: a pid that is not a number is left out.
    sw.infos[1]["pid"] = "42; rm"
    assert sw.pids() == [41]


def test_memory_short_turns_it_off_and_says_why(monkeypatch):
    sw = spare_world.SpareWorld(True)
    world = World(SimpleNamespace(nprocs=16), LocalLauncher.__new__(LocalLauncher))
    monkeypatch.setattr(spare_world, "per_engine_bytes", lambda processes: 250 * MB)
    monkeypatch.setattr(
        spare_world.psutil, "virtual_memory", lambda: SimpleNamespace(available=5 * 2**30)
    )
    # 16 processes of 250 MB and 2 GB for everything else do not fit in 5 GB.
    assert not sw._memory_allows(world)
    assert sw.line().startswith("spare world: off; memory is short: 5.0 GB free, 16 processes")
    monkeypatch.setattr(
        spare_world.psutil, "virtual_memory", lambda: SimpleNamespace(available=7 * 2**30)
    )
    assert sw._memory_allows(world)


def test_its_engine_ids_are_reserved_beside_the_standbys():
    world = World(SimpleNamespace(nprocs=4), None)
    world.spare_world = spare_world.SpareWorld(True)
    world.spare_world.reserved |= {5000, 5001}
    assert world.reserved_ids() == {5000, 5001}
