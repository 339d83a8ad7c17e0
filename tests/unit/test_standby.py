"""The standby's sizing, its refusals, its words and its bookkeeping, without processes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from jaxsys_kernel.cluster import standby
from jaxsys_kernel.cluster.launchers import LocalLauncher, MpiLauncher, SshLauncher
from jaxsys_kernel.cluster.launchers.kubernetes import KubernetesLauncher
from jaxsys_kernel.errors import ConfigError

GB = 2**30
MB = 2**20


def test_a_world_fits_when_memory_allows():
    assert standby.automatic_size(4, 20 * GB, 250 * MB) == (4, None)


def test_less_memory_gives_a_smaller_standby_and_says_why():
    size, note = standby.automatic_size(64, 6 * GB, 250 * MB)
    # 6 GB free, 2 GB kept for everything else: 16 processes of 250 MB.
    assert size == 16
    assert "16 of 64" in note and "6.0 GB" in note and "250 MB" in note


def test_no_room_at_all_gives_none():
    assert standby.automatic_size(8, 1 * GB, 250 * MB)[0] == 0


def test_a_negative_size_and_a_launcher_that_cannot_keep_one_are_refused():
    with pytest.raises(ConfigError, match="0 or more"):
        standby.check_requested(-1, "local", True, "local or ssh")
    with pytest.raises(ConfigError, match="the mpi launcher starts every process as one job"):
        standby.check_requested(2, "mpi", False, "local or ssh")
    standby.check_requested(0, "mpi", False, "local or ssh")
    standby.check_requested(None, "slurm", False, "local or ssh")


def test_local_clusters_keep_one_by_default_and_remote_ones_only_when_asked():
    def made(kind, requested):
        config = SimpleNamespace(standby=requested)
        return standby.for_launcher(config, kind.__new__(kind))

    assert made(LocalLauncher, None).by_default
    assert not made(SshLauncher, None).by_default
    assert made(SshLauncher, 2).requested == 2
    with pytest.raises(ConfigError, match="mpi"):
        made(MpiLauncher, 1)


def test_standby_ids_stay_clear_of_every_rank():
    assert standby._first_id(4) == 1000
    assert standby._first_id(1024) == 10000


def test_the_status_line_says_what_is_ready():
    line = standby.status_line
    base = {"taken": 0, "note": None}
    assert line({**base, "size": 4, "ready": 4, "booting": 0}) == (
        "standby: 4 of 4 processes ready for a restart"
    )
    assert "2 of 4 processes ready, 2 booting" in line(
        {**base, "size": 4, "ready": 2, "booting": 2}
    )
    assert "--standby N" in line({**base, "size": 0, "ready": 0, "booting": 0})
    assert line({**base, "size": 1, "ready": 1, "booting": 0, "note": "memory"}).endswith(
        "; memory"
    )


class Answer:
    def __init__(self, value=True):
        self.value = value

    def done(self):
        return True

    def exception(self):
        return None

    def result(self):
        return self.value


class Engine:
    def __init__(self, asked: list, eid: int, booted: bool):
        self.asked, self.eid, self.booted = asked, eid, booted

    def apply_async(self, fn, *args):
        self.asked.append((self.eid, fn.name))
        return Answer(self.booted)


class Client:
    def __init__(self, booted: dict[int, bool]):
        self.asked: list = []
        self.booted = booted

    @property
    def ids(self):
        return list(self.booted)

    def __getitem__(self, eid):
        return Engine(self.asked, eid, self.booted[eid])


def _world(spares: dict[int, int], booted: dict[int, bool], exited=()):
    engines = {
        f"standby-p{r}-e{eid}": SimpleNamespace(state="after" if r in exited else "running")
        for r, eid in spares.items()
    }
    launcher = LocalLauncher.__new__(LocalLauncher)
    launcher.ipp = SimpleNamespace(engines=engines)
    return SimpleNamespace(client=Client(booted), ipp=launcher.ipp, launcher=launcher)


def _standby_with(spares: dict[int, int]) -> standby.Standby:
    s = standby.Standby(requested=len(spares), by_default=True)
    s.size = len(spares)
    s.spares = {r: standby.Spare(r, eid, f"standby-p{r}-e{eid}") for r, eid in spares.items()}
    s.reserved = set(spares.values())
    return s


def test_only_booted_registered_engines_are_taken_and_the_rest_stay():
    s = _standby_with({0: 1000, 1: 1001, 2: 1002})
    # 1000 has booted, 1001 registered but still importing, 1002 not registered yet.
    world = _world({0: 1000, 1: 1001, 2: 1002}, {1000: True, 1001: False})
    seen = []
    taken = asyncio.run(s.take(world, [0, 1, 2], lambda *a: seen.append(a), wait_s=0.2))
    assert list(taken) == [0] and taken[0].engine_id == 1000
    assert set(s.spares) == {1, 2} and s.last_taken == 1
    # The wait for the others was shown as progress, and each engine was asked once per try.
    assert seen and seen[-1] == ("standby processes ready", 1, 3)
    assert {eid for eid, name in world.client.asked} == {1000, 1001}
    assert {name for _, name in world.client.asked} == {"wait_booted"}


def test_a_standby_kept_in_pods_is_taken_whole_or_not_at_all():
    s = _standby_with({0: 1000, 1: 1001})
    world = _world({0: 1000, 1: 1001}, {1000: True, 1001: False})
    world.launcher = KubernetesLauncher.__new__(KubernetesLauncher)
    world.launcher.worlds = SimpleNamespace(
        name="w", standby={0: ("standby-p0-e1000", {}), 1: ("standby-p1-e1001", {})}
    )
    world.launcher.worlds.pod_of = lambda rank: SimpleNamespace(
        status=SimpleNamespace(phase="Running")
    )
    # Only 1000 has booted: a pod cannot start rank 1's engine alone, so neither is taken.
    assert asyncio.run(s.take(world, [0, 1], lambda *a: None, wait_s=0.1)) == {}
    assert set(s.spares) == {0, 1} and s.last_taken == 0
    world.client.booted[1001] = True
    s._booted.clear()
    assert set(asyncio.run(s.take(world, [0, 1], lambda *a: None, wait_s=5))) == {0, 1}


def test_a_pods_standby_is_gone_once_its_entry_or_its_pod_is():
    launcher = KubernetesLauncher.__new__(KubernetesLauncher)
    phase = {"now": "Running"}
    launcher.worlds = SimpleNamespace(name="w", standby={0: ("standby-p0-e1000", {})})
    launcher.worlds.pod_of = lambda rank: SimpleNamespace(
        status=SimpleNamespace(phase=phase["now"])
    )
    assert not launcher.standby_gone("standby-p0-e1000", 0)
    assert launcher.standby_gone("standby-p0-e999", 0)  # another set's entry
    assert launcher.standby_gone("standby-p1-e1001", 1)  # no entry
    phase["now"] = "Succeeded"
    assert launcher.standby_gone("standby-p0-e1000", 0)


def test_a_standby_in_pods_is_one_per_pod_whatever_the_number_asked():
    world = SimpleNamespace(
        config=SimpleNamespace(nprocs=4), launcher=KubernetesLauncher.__new__(KubernetesLauncher)
    )
    s = standby.Standby(requested=2, by_default=False)
    assert s.decide_size(world) == 4 and s.note == "one standby process per pod: 4, not 2"
    assert standby.Standby(requested=0, by_default=False).decide_size(world) == 0


def test_an_engine_that_exited_is_forgotten():
    s = _standby_with({1: 1001})
    world = _world({1: 1001}, {1001: True}, exited={1})
    assert asyncio.run(s.take(world, [1], lambda *a: None, wait_s=0)) == {}
    assert s.spares == {} and world.ipp.engines == {}


def test_describe_counts_ready_and_booting():
    s = _standby_with({0: 1000, 1: 1001})
    world = _world({0: 1000, 1: 1001}, {1000: True})
    assert s.describe(world) == {"size": 2, "ready": 1, "booting": 1, "taken": 0, "note": None}


def test_a_standby_the_launcher_cannot_keep_is_refused_before_anything_starts():
    from jaxsys_kernel import Cluster

    cluster = Cluster(hosts=2, launcher="mpi", standby=2, progress=lambda e: None)
    with pytest.raises(ConfigError, match="cannot keep standby processes"):
        cluster.start_sync()
    assert cluster.state == "stopped"
