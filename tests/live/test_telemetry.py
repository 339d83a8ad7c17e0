"""Telemetry from real JAX processes: live while a cell runs, exact cache counts."""

from __future__ import annotations

import time

import pytest

from jaxsys_kernel import Cluster
from jaxsys_kernel import cells as executor


class Quiet(executor.Sink):
    def stdout(self, text):
        pass

    stderr = stdout


@pytest.fixture(scope="module")
def cached_cluster(tag, tmp_path_factory):
    cache = tmp_path_factory.mktemp("jax-cache")
    c = Cluster(
        hosts=2,
        devices_per_host=1,
        cache_dir=str(cache),
        env={
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        },
        progress=lambda e: None,
    )
    c.start_sync()
    yield c
    c.kill()


def run(cluster, code):
    r = executor.execute(cluster, code, sink=Quiet())
    executor.raise_for_run(r)


def test_heartbeats_arrive_while_a_cell_blocks(cached_cluster):
    hub = cached_cluster.telemetry
    seen: list[tuple[float, int]] = []
    unsubscribe = hub.subscribe(lambda h: seen.append((time.monotonic(), h.received)), max_rate=50)
    try:
        t0 = time.monotonic()
        run(cached_cluster, "import time\ntime.sleep(3)")
        t1 = time.monotonic()
    finally:
        unsubscribe()
    during = [n for t, n in seen if t0 + 0.5 < t < t1 - 0.2]
    # Heartbeats every second from two processes: counts grow while the cell is running.
    assert len(during) >= 2 and during[-1] > during[0]
    states = [live.state for live in hub.liveness()]
    assert states == ["alive", "alive"]


def test_busy_flag_follows_cells(cached_cluster):
    hub = cached_cluster.telemetry
    seen_busy = []
    unsubscribe = hub.subscribe(
        lambda h: seen_busy.append([lv.busy for lv in h.liveness()]), max_rate=100
    )
    try:
        run(cached_cluster, "import time\ntime.sleep(1.5)")
    finally:
        unsubscribe()
    assert [True, True] in seen_busy
    # The end of a cell is said by the next periodic beat, within one interval (1 s).
    deadline = time.monotonic() + 3 * hub.interval
    while any(lv.busy for lv in hub.liveness()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [lv.busy for lv in hub.liveness()] == [False, False]


def test_cache_counts_for_a_scripted_compile_sequence(cached_cluster):
    hub = cached_cluster.telemetry
    before = {s.rank: s for s in hub.cache_stats()}
    # One new function compiled twice with the in-memory caches cleared in between: the
    # second compile asks the persistent cache again. On CPU only process 0 can hit it
    # (the key includes each process's own topology).
    run(
        cached_cluster,
        "import jax, jax.numpy as jnp\n"
        "x = jnp.arange(7.0)\n"
        "g = jax.jit(lambda v: jnp.sin(v) * 3 + 17)\n"
        "g(x).block_until_ready()\n"
        "jax.clear_caches()\n"
        "g = jax.jit(lambda v: jnp.sin(v) * 3 + 17)\n"
        "g(x).block_until_ready()\n",
    )
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        after = {s.rank: s for s in hub.cache_stats()}
        if all(after[r].requests > before[r].requests for r in after):
            break
        time.sleep(0.05)
    time.sleep(0.3)
    after = {s.rank: s for s in hub.cache_stats()}
    new_requests = {r: after[r].requests - before[r].requests for r in after}
    new_hits = {r: after[r].hits - before[r].hits for r in after}
    assert new_requests[0] == new_requests[1] and new_requests[0] >= 2
    assert new_hits[0] == new_requests[0] // 2  # the second round hits, once per compile
    assert new_hits[1] == 0
    assert after[0].misses == after[0].requests - after[0].hits
    assert "jit(<lambda>)" in after[0].last_functions


def test_restart_resets_numbers_and_keeps_reporting(cached_cluster):
    cached_cluster.restart_sync()
    hub = cached_cluster.telemetry
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and [lv.state for lv in hub.liveness()] != ["alive", "alive"]:
        time.sleep(0.05)
    lives = hub.liveness()
    assert [lv.state for lv in lives] == ["alive", "alive"]
    assert all(lv.incarnation == 2 for lv in lives)
