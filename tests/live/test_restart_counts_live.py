"""On real engines, the state the sidebar and the dashboard get tells a process restarted
alone from its predecessor: the world's incarnation stays, its restart count goes up."""

from __future__ import annotations

import time

from jaxsys_kernel.kernel import comm
from jaxsys_kernel.magics.session import MultihostSession


def _rows(session) -> dict[int, dict]:
    return {r["rank"]: r for r in comm.cluster_state(session)["cluster"]["processes"]}


def _wait_rows(session, want, what: str, timeout: float = 60.0) -> dict[int, dict]:
    """Poll the comm's rows until ``want(rows)`` holds; fail naming ``what`` after a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        rows = _rows(session)
        if want(rows):
            return rows
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {rows}"
        time.sleep(0.1)


def _launch(rows: dict[int, dict]) -> dict[int, tuple]:
    return {r: (row["state"], row["incarnation"], row["restarts"]) for r, row in rows.items()}


def test_a_rejoined_process_counts_its_restart_and_keeps_the_incarnation(cluster):
    session = MultihostSession()
    session.cluster = cluster
    assert cluster.telemetry is not None, "this test reads liveness from telemetry"
    first = _wait_rows(
        session, lambda rows: all(r["state"] == "alive" for r in rows.values()), "heartbeats"
    )
    incarnation = first[0]["incarnation"]
    assert _launch(first) == {0: ("alive", incarnation, 0), 1: ("alive", incarnation, 0)}
    cluster.restart_process_sync(1)
    after = _wait_rows(
        session,
        lambda rows: rows[1]["state"] == "alive" and rows[1]["heartbeat_age"] is not None,
        "process 1 to rejoin",
    )
    assert _launch(after) == {0: ("alive", incarnation, 0), 1: ("alive", incarnation, 1)}
    # A world restart gives every process the next incarnation, and the counts start again
    # with it: they count restarts of a process alone within the world the sidebar shows.
    cluster.restart_sync()
    world = _wait_rows(
        session,
        lambda rows: all(r["incarnation"] == incarnation + 1 for r in rows.values()),
        "the new world's heartbeats",
    )
    assert [row["restarts"] for row in world.values()] == [0, 0]
