"""The Cluster API on real engines: ranks, devices, collectives, restart, failures."""

from __future__ import annotations

import logging
import threading

import pytest

from jaxsys_kernel import Cluster
from jaxsys_kernel import cells as executor


def _jax_facts():
    import jax

    return jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count()


def test_process_i_is_rank_i(cluster):
    facts = cluster.view.apply_sync(_jax_facts)
    assert facts == [(0, 2, 2, 4), (1, 2, 2, 4)]
    # Engine order is the cluster's rank order, whatever ids ipyparallel gave.
    assert [p.rank for p in cluster.processes] == [0, 1]
    assert cluster.processes[0].devices == [0, 1]
    assert cluster.processes[1].devices == [2048, 2049]


def test_coordinator_binds_loopback(cluster):
    assert cluster.coordinator_address.startswith("127.0.0.1:")


def test_the_controller_binds_only_ports_the_kernel_holds(cluster):
    import psutil

    from jaxsys_kernel.cluster import controller_ports
    from jaxsys_kernel.cluster.launchers.base import BROADCAST_DEPTH

    held = {s.getsockname()[1] for s in cluster.world.launcher._controller_ports}
    assert len(held) == controller_ports.count(BROADCAST_DEPTH)
    controller = psutil.Process(cluster.world.ipp.controller.pid)
    listening = {
        c.laddr.port
        for proc in [controller, *controller.children(recursive=True)]
        for c in proc.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN
    }
    # Every queue and channel bound one of them: none was left to a port found free and let go.
    assert listening == held, (sorted(listening), sorted(held))


def test_a_controller_queue_that_lost_its_port_ends_the_start_saying_so(monkeypatch, caplog):
    import re
    import shutil
    import socket
    import time
    from pathlib import Path

    from jaxsys_kernel.cluster import controller_ports
    from jaxsys_kernel.cluster.records import ClusterStartError

    from ..harness import TAG_VAR, new_tag, wait_no_processes

    # A tag of its own: the module's shared cluster carries the module's.
    tag = new_tag()
    monkeypatch.setenv(TAG_VAR, tag)
    hold, taken = controller_ports.hold, []

    def hold_then_lose_the_queues_port(n):
        held = hold(n)
        # The third port is the engines' side of the queue that carries requests to them
        # (ipyparallel's order): someone else listens there before the controller binds it.
        thief = socket.socket()
        thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        thief.bind(("127.0.0.1", held[2].getsockname()[1]))
        thief.listen()
        taken.append(thief)
        return held

    monkeypatch.setattr(controller_ports, "hold", hold_then_lose_the_queues_port)
    c = Cluster(hosts=2, devices_per_host=1, progress=lambda e: None)
    began = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(ClusterStartError) as raised:
            c.start_sync()
    finally:
        port = taken[0].getsockname()[1]
        for s in taken:
            s.close()
    text = str(raised.value)
    kept = re.search(r"the logs are kept in (\S+?)\.$", text)
    assert kept and Path(kept[1]).is_dir(), text
    shutil.rmtree(kept[1])  # the start kept them for its user; this test reads the message
    assert "a process of the controller ended at start" in text, text
    assert f"Address already in use (addr='tcp://127.0.0.1:{port}')" in text
    # Said once the controller's log shows it, not after the engines' 30 s.
    assert time.monotonic() - began < 25, text
    assert not wait_no_processes(tag)
    # The kernel's client let go of what it could not deliver: its context ended at once.
    assert "did not end" not in caplog.text, caplog.text


def test_cross_process_psum(cluster):
    code = """
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((4,), ('x',))
local = np.full((2,), jax.process_index() + 1.0, np.float32)
arr = jax.make_array_from_process_local_data(NamedSharding(mesh, P('x')), local)
total = float(jax.jit(lambda a: a.sum())(arr))
print('total', total)
"""
    lines: list[str] = []

    class Capture(executor.Sink):
        def stdout(self, text):
            lines.append(text)

    run = executor.execute(cluster, code, sink=Capture())
    executor.raise_for_run(run)
    # 1+1 from process 0's two devices, 2+2 from process 1's: 6, printed once for both.
    assert "".join(lines) == "[p0-1] total 6.0\n"


def test_status_rows(cluster):
    rows = cluster.status()
    assert [r["rank"] for r in rows] == [0, 1]
    assert all(r["state"] == "ready" and r["pid"] for r in rows)


def test_restart_replaces_every_process(cluster):
    old = [p.pid for p in cluster.processes]
    seconds = cluster.restart_sync()
    assert seconds > 0
    new = [p.pid for p in cluster.processes]
    assert set(old).isdisjoint(new)
    assert cluster.view.apply_sync(_jax_facts) == [(0, 2, 2, 4), (1, 2, 2, 4)]


def test_rank_mismatch_is_refused(cluster):
    from jaxsys_kernel.engine import bootstrap

    with pytest.raises(Exception, match="has rank 1"):
        cluster.client[cluster.processes[1].engine_id].apply_sync(
            bootstrap.initialize, "127.0.0.1:1", 2, 0
        )


def test_an_engine_that_does_not_answer_at_bring_up_is_named(cluster):
    import asyncio
    import time

    from jaxsys_kernel.cluster.first_answers import answers
    from jaxsys_kernel.cluster.records import ClusterStartError

    eids = [p.engine_id for p in cluster.processes]
    # Process 1's engine is busy with an earlier request, so the question waits behind it.
    busy = cluster.client[eids[1]].apply_async(time.sleep, 5)
    ar = cluster.client[eids].apply_async(lambda: "here")
    try:
        with pytest.raises(ClusterStartError) as raised:
            asyncio.run(answers(cluster.world, ar, eids, 1.0))
        assert f"engine(s) {eids[1]} registered but did not answer within 1 s" in str(raised.value)
    finally:
        # A real failed start keeps the logs; this one does not stop the cluster.
        cluster.world.keep_logs = False
        busy.get(timeout=60)


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        ({"hosts": 0}, "at least 1"),
        ({"launcher": "pbs"}, "unknown launcher"),
        ({"launcher": "ssh", "hosts": 2}, "host names"),
        ({"devices_per_host": 0}, "at least 1"),
        ({"hosts": 2, "process_env": {5: {}}}, "process 5"),
    ],
)
def test_bad_options(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        Cluster(**kwargs)


def test_engine_id_is_process_index(cluster):
    assert [p.engine_id for p in cluster.processes] == [0, 1]


def _launcher_waiters(cluster) -> list[threading.Thread]:
    """The threads in which ipyparallel's launchers wait for this cluster's processes."""
    from jaxsys_kernel.cluster.teardown import launcher_pids

    ipp = cluster._ipp
    pids = {ipp.controller.pid, *(p for es in ipp.engines.values() for p in launcher_pids(es))}
    names = {f"wait(pid={pid})" for pid in pids}
    return [t for t in threading.enumerate() if t.name in names]


def test_stop_is_silent(tag, capfd, caplog):
    c = Cluster(hosts=2, devices_per_host=1, progress=lambda e: None)
    c.start_sync()
    c._ensure_loop()
    loop_thread = c._loop_thread
    waiters = _launcher_waiters(c)
    assert len(waiters) == 3  # the controller's and one per engine
    capfd.readouterr()
    with caplog.at_level(logging.WARNING):
        c.stop_sync()
        # The launchers learn of their processes' exit on the cluster's loop thread, after
        # the stop returned: wait for their threads, then for the loop's thread, which ends
        # once nothing runs on it (a stopped cluster keeps none), before judging what was
        # printed. What they handed it has run by then, or went unheard with the loop.
        for t in waiters:
            t.join(timeout=10)
        assert not any(t.is_alive() for t in waiters)
        loop_thread.join(timeout=10)
        assert not loop_thread.is_alive()
    out, err = capfd.readouterr()
    assert err == "" and out == ""
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert c.state == "stopped"
