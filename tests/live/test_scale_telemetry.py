"""Hundreds of simulated agents against the real hub: what the front end gets stays small.

The agents (tests/support_telemetry.py) send over the hub's real CurveZMQ socket from a few
processes; the comm's state is built by the real ``cluster_state`` from the hub's liveness.
"""

import json
from types import SimpleNamespace

import psutil
import pytest

from jaxsys_kernel.cluster.records import ProcessInfo
from jaxsys_kernel.kernel import comm
from jaxsys_kernel.telemetry import aggregate
from jaxsys_kernel.telemetry.hub import TelemetryHub
from tests.support_telemetry import SimulatedAgents, wait_for

INTERVAL = 0.5


def _session(hub, n):
    procs = [
        ProcessInfo(rank=r, host=f"node{r}", pid=10_000 + r, devices=[r], state="ready")
        for r in range(n)
    ]
    cluster = SimpleNamespace(
        state="ready",
        nprocs=n,
        processes=procs,
        telemetry=hub,
        security="mTLS",
        heartbeat_timeout=10.0,
        refresh_states=lambda: None,
    )
    return SimpleNamespace(cluster=cluster)


def _alive(hub):
    return sum(1 for live in hub.liveness() if live.state == "alive")


def _state_bytes(session, group=None) -> int:
    return len(json.dumps(comm.cluster_state(session, group=group)))


def _run(n, silent=()):
    """Simulate ``n`` agents; return (bytes of a state, bytes with a group open, summary)."""
    hub = TelemetryHub(n, curve=True, interval=INTERVAL)
    try:
        silent_after = dict.fromkeys(silent, 2 * INTERVAL)
        with SimulatedAgents(hub, n, interval=INTERVAL, silent_after=silent_after) as sim:
            workers = [psutil.Process(pid) for pid in sim.pids()]
            session = _session(hub, n)
            wait_for(lambda: hub.received >= 2 * n, f"events from {n} agents")
            if silent:
                wait_for(
                    lambda: (
                        _alive(hub) == n - len(silent)
                        and all(
                            live.state == "dead" for live in hub.liveness() if live.rank in silent
                        )
                    ),
                    f"{len(silent)} silent agents shown dead",
                )
            else:
                wait_for(lambda: _alive(hub) == n, f"{n} agents alive")
            summary = comm.cluster_state(session)["cluster"]["summary"]
            sizes = (_state_bytes(session), _state_bytes(session, group=0))
        assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
        return (*sizes, summary)
    finally:
        hub.close()


@pytest.mark.timeout(180)
def test_bytes_per_update_do_not_grow_with_processes():
    small, small_open, _ = _run(128)
    large, large_open, summary = _run(512)
    assert summary["by_state"] == {"alive": 512}
    assert len(summary["groups"]) == aggregate.MAX_GROUPS
    # Above a group size the state is a summary: four times the processes, about the
    # same bytes (only rank labels grow a digit).
    assert large < 1.25 * small, (small, large)
    # Opening a group adds that group's rows only.
    assert large_open - large < aggregate.group_size(512) * 250


@pytest.mark.timeout(120)
def test_silent_agents_are_counted_dead_in_their_group():
    silent = (5, 6, 70)
    _, _, summary = _run(128, silent=silent)
    assert summary["by_state"] == {"alive": 125, "dead": 3}
    size = summary["group_size"]
    worst = {g["group"]: g["worst"] for g in summary["groups"]}
    assert {g for g, w in worst.items() if w == "dead"} == {5 // size, 70 // size}


@pytest.mark.timeout(180)
def test_comm_updates_stay_bounded_and_a_group_opens_at_256():
    n = 256
    hub = TelemetryHub(n, curve=True, interval=INTERVAL)
    sent: list[dict] = []
    front_end = SimpleNamespace(send=sent.append, on_msg=lambda f: None, on_close=lambda f: None)
    try:
        with SimulatedAgents(hub, n, interval=INTERVAL):
            wait_for(lambda: _alive(hub) == n, f"{n} agents alive")
            comms = comm.ClusterComms(_session(hub, n), max_rate=20.0)
            comms.on_open(front_end, {"content": {"data": {"v": comm.SCHEMA_VERSION}}})
            # The hub's subscription pushes deltas while the agents beat.
            wait_for(lambda: sum(m["type"] == "delta" for m in sent) >= 10, "10 deltas")
            deltas = [m for m in sent if m["type"] == "delta"]
            # No group open: no rows at all, only the summary when it changed.
            assert all(m["rows"]["rows"] == {} and m["rows"]["ages"] == {} for m in deltas)
            assert max(len(json.dumps(m)) for m in deltas) < 8000
            comms.on_msg({"content": {"data": {"type": "group", "group": 5}}})
            size = aggregate.group_size(n)
            held = None
            for m in sent:
                held = (
                    aggregate.held_state(m)
                    if m["type"] == "state"
                    else aggregate.apply_delta(held, m)
                )
            ranks = [p["rank"] for p in held["cluster"]["processes"]]
            assert ranks == list(range(5 * size, 6 * size))
            assert all(p["state"] == "alive" for p in held["cluster"]["processes"])
            assert held["cluster"]["summary"]["by_state"] == {"alive": n}
            comms.close()
    finally:
        hub.close()
