"""The spare world on real engines: a world restart swaps in processes already joined to JAX,
a cell after the swap computes a collective right, the spare world is made again, and no
spare process outlives a stop or the death of the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from jaxsys_kernel import Cluster
from jaxsys_kernel.cluster import spare_world

from ..harness import Kernel, new_tag, tagged_processes, wait_no_processes

NPROCS = 2
READY_WAIT_S = 120.0
# The registration deadline of the kernel's cluster: ample for 2 engines on 2 busy cores.
ORPHAN_WAIT_S = 20.0


def _whoami():
    import jax

    return os.getpid(), jax.process_index(), jax.process_count()


def _gathered_sum():
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    return int(multihost_utils.process_allgather(jnp.int32(jax.process_index() + 1)).sum())


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _wait_spare(cluster) -> list[int]:
    """The spare world's pids once it is ready (bounded wait)."""
    sw = cluster.world.spare_world
    deadline = time.monotonic() + READY_WAIT_S
    while sw.state != "ready":
        assert time.monotonic() < deadline, f"the spare world never got ready: {sw.line()}"
        time.sleep(0.1)
    return sw.pids()


@pytest.fixture(scope="module")
def cluster(tag):
    c = Cluster(
        hosts=NPROCS, devices_per_host=1, standby=0, spare_world=True, progress=lambda e: None
    )
    t0 = time.perf_counter()
    c.start_sync()
    c.cold_seconds = time.perf_counter() - t0
    yield c
    c.kill()


def test_a_restart_after_a_hang_swaps_in_the_spare_world(cluster):
    spare_pids = _wait_spare(cluster)
    assert len(spare_pids) == NPROCS
    old_pids = {p.pid for p in cluster.processes}
    assert not set(spare_pids) & old_pids
    # Process 0 enters a collective that process 1 never joins: it hangs in it.
    stuck = cluster.call([0], _gathered_sum, timeout=1.0)
    assert stuck.missing == [0]
    took = cluster.restart_sync()
    print(f"restart from the spare world {took:.3f} s, cold start {cluster.cold_seconds:.3f} s")
    assert cluster.world.spare_world.last_swapped
    # The processes serving the ranks now are the spare world's, each in its own rank.
    assert sorted(p.pid for p in cluster.processes) == spare_pids
    who = cluster.call(None, _whoami, timeout=60).values()
    assert sorted(pid for pid, _, _ in who.values()) == spare_pids
    assert {r: (rank, count) for r, (_, rank, count) in who.items()} == {
        r: (r, NPROCS) for r in range(NPROCS)
    }
    assert set(cluster.call(None, _gathered_sum, timeout=60).values().values()) == {1 + 2}
    assert not _wait_gone(old_pids)
    assert [p.state for p in cluster.processes] == ["ready"] * NPROCS


def test_the_swapped_in_processes_report_to_telemetry(cluster):
    incarnation = cluster.world.incarnation
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        beats = {lv.rank: lv.incarnation for lv in cluster.telemetry.liveness()}
        if beats == dict.fromkeys(range(NPROCS), incarnation):
            break
        time.sleep(0.1)
    assert beats == dict.fromkeys(range(NPROCS), incarnation)


def test_one_process_rejoins_the_swapped_in_world(cluster):
    assert cluster.world.spare_world.last_swapped
    old = cluster.processes[1].pid
    cluster.restart_process_sync(1)
    assert cluster.processes[1].pid != old
    who = cluster.call(None, _whoami, timeout=60).values()
    assert {r: (rank, count) for r, (_, rank, count) in who.items()} == {
        r: (r, NPROCS) for r in range(NPROCS)
    }
    assert [p.state for p in cluster.processes] == ["ready"] * NPROCS


def test_the_spare_world_is_made_again_with_new_processes(cluster):
    in_use = {p.pid for p in cluster.processes}
    new_spare = _wait_spare(cluster)
    assert len(new_spare) == NPROCS and not set(new_spare) & in_use
    # It joined a JAX world of its own: a second swap works as the first did.
    cluster.restart_sync()
    assert cluster.world.spare_world.last_swapped
    assert sorted(p.pid for p in cluster.processes) == new_spare
    assert set(cluster.call(None, _gathered_sum, timeout=60).values().values()) == {3}


def test_a_spare_world_missing_a_process_is_dropped_for_the_ordinary_path(cluster):
    pids = _wait_spare(cluster)
    os.kill(pids[1], signal.SIGKILL)
    assert not _wait_gone(pids[1:])
    cluster.restart_sync()
    sw = cluster.world.spare_world
    assert not sw.last_swapped
    assert not set(pids) & {p.pid for p in cluster.processes}
    assert set(cluster.call(None, _gathered_sum, timeout=60).values().values()) == {3}
    # Its other process went with it, and a whole new one is made.
    assert not _wait_gone(pids)
    assert not set(_wait_spare(cluster)) & set(pids)


def test_memory_short_turns_the_spare_world_off_and_restarts_go_on(cluster, monkeypatch):
    _wait_spare(cluster)
    # As if every byte of this machine were needed by everything else.
    monkeypatch.setattr(spare_world, "MEMORY_RESERVE_BYTES", 2**62)
    cluster.restart_sync()
    sw = cluster.world.spare_world
    assert sw.last_swapped
    deadline = time.monotonic() + 30
    while "memory is short" not in sw.line() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sw.line().startswith("spare world: off; memory is short"), sw.line()
    cluster.restart_sync()
    assert not sw.last_swapped
    assert set(cluster.call(None, _gathered_sum, timeout=60).values().values()) == {3}


def test_stop_leaves_no_spare_process(cluster):
    # With memory enough again, the restart makes the spare world again.
    cluster.restart_sync()
    pids = _wait_spare(cluster)
    cluster.kill()
    assert not _wait_gone(pids)
    assert cluster.world.spare_world.state == "off"


OWNER = textwrap.dedent(
    """
    import time
    from jaxsys_kernel import Cluster
    c = Cluster(hosts=2, devices_per_host=1, standby=0, spare_world=True,
                progress=lambda e: None)
    c.start_sync()
    deadline = time.monotonic() + 120
    while c.world.spare_world.state != "ready" and time.monotonic() < deadline:
        time.sleep(0.1)
    print("ready", len(c.world.spare_world.pids()), flush=True)
    time.sleep(600)
    """
)


def test_the_spare_world_dies_with_the_process_that_started_it():
    tag = new_tag()
    env = {**os.environ, "JAXSYS_TEST_RUN": tag}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        line = owner.stdout.readline()
        assert line.split() == ["ready", "2"], line
        # The controller, the fork server, two engines and two spare engines at least.
        assert len(tagged_processes(tag)) >= 6
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
    assert not wait_no_processes(tag, timeout=15)


def test_the_kernel_keeps_a_spare_world_and_shows_it():
    tag = new_tag()
    k = Kernel(tag)
    try:
        out = k.execute(
            "%jaxsys start --hosts 2 --devices-per-host 1 --standby 0 --spare-world"
            f" --register-timeout {ORPHAN_WAIT_S:g}",
            timeout=180,
        )
        assert out.status == "ok", out.stderr
        deadline = time.monotonic() + READY_WAIT_S
        while time.monotonic() < deadline:
            status = k.execute("%jaxsys status").stdout
            if "spare world: ready, 2 processes joined" in status:
                break
            time.sleep(0.5)
        assert "spare world: ready, 2 processes joined" in status, status
        out = k.execute("%jaxsys restart", timeout=180)
        assert out.status == "ok" and "(the spare world, swapped in)" in out.stdout, out.stdout
        out = k.execute(
            "%%multihost\nimport jax, jax.numpy as jnp\n"
            "from jax.experimental import multihost_utils as mu\n"
            "print('sum', int(mu.process_allgather(jnp.int32(jax.process_index() + 1)).sum()))",
            timeout=120,
        )
        assert out.status == "ok" and "sum 3" in out.stdout, out.stdout
        status = k.execute("%jaxsys status").stdout
        assert "spare world: refilling" in status or "spare world: ready" in status, status
        os.kill(k.pid, signal.SIGKILL)
        k.kc.stop_channels()
        # A refill engine still booting as the kernel dies gives up within its own wait for
        # the controller (see the standby's test).
        assert not wait_no_processes(tag, timeout=ORPHAN_WAIT_S + 15)
    finally:
        if psutil.pid_exists(k.pid):
            k.shutdown()
        k.km.cleanup_resources()
