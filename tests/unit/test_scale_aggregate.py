"""Summaries of many processes keep their size; deltas carry only what changed."""

import json
from types import SimpleNamespace

import pytest

from jaxsys_kernel.cluster.records import ProcessInfo
from jaxsys_kernel.errors import ProtocolError
from jaxsys_kernel.kernel import comm
from jaxsys_kernel.telemetry import aggregate


def rows(n, dead=(), error="EngineError: killed"):
    return [
        {
            "rank": r,
            "host": f"node{r // 8}",
            "pid": 1000 + r,
            "devices": [r],
            "state": "dead" if r in dead else "alive",
            "heartbeat_age": 0.4 + r % 3,
            "busy": r % 2 == 0,
            "error": error if r in dead else "",
        }
        for r in range(n)
    ]


def test_summary_counts_by_state_group_and_error():
    s = aggregate.summarize(rows(1024, dead={5, 6, 7, 900}))
    assert s["by_state"] == {"alive": 1020, "dead": 4}
    assert s["group_size"] == 32 and len(s["groups"]) == aggregate.MAX_GROUPS
    g0 = s["groups"][0]
    assert (g0["ranks"], g0["hosts"], g0["worst"]) == ("0-31", "4 hosts", "dead")
    assert g0["states"] == {"alive": 29, "dead": 3} and g0["oldest_heartbeat"] == 2
    assert s["errors"] == [{"error": "EngineError: killed", "count": 4, "ranks": "5-7,900"}]


def test_summary_size_does_not_grow_with_processes():
    small = len(json.dumps(aggregate.summarize(rows(256))))
    large = len(json.dumps(aggregate.summarize(rows(4096))))
    # Only the rank labels get longer (more digits).
    assert large < small * 1.2


def test_many_distinct_errors_are_cut():
    many = rows(100, dead=set(range(20)))
    for r in many[:20]:
        r["error"] = f"error {r['rank']}"
    errors = aggregate.summarize(many)["errors"]
    assert len(errors) == aggregate.MAX_ERRORS + 1
    assert errors[-1]["error"] == f"{20 - aggregate.MAX_ERRORS} more distinct errors"


def test_deltas_send_only_changes():
    d = aggregate.RowDeltas()
    first = rows(100)
    v1 = d.update(first)
    assert len(d.changes(0)["rows"]) == 100
    # A new heartbeat age alone is no change.
    aged = [{**r, "heartbeat_age": 9.0} for r in first]
    assert d.update(aged) == v1 and d.changes(v1)["rows"] == {}
    aged[7]["state"] = "dead"
    v2 = d.update(aged[:-1])
    ch = d.changes(v1)
    assert (ch["v"], ch["base"], list(ch["rows"]), ch["gone"]) == (v2, v1, [7], [99])
    assert ch["rows"][7]["state"] == "dead"


def _cluster(n):
    procs = [
        ProcessInfo(rank=r, host=f"h{r}", pid=r + 1, devices=[r], state="ready") for r in range(n)
    ]
    return SimpleNamespace(
        state="ready",
        nprocs=n,
        processes=procs,
        telemetry=None,
        security="",
        heartbeat_timeout=10.0,
        refresh_states=lambda: None,
    )


def test_small_clusters_send_every_row_large_ones_a_summary_and_one_group():
    small = comm.cluster_state(SimpleNamespace(cluster=_cluster(8)))["cluster"]
    assert len(small["processes"]) == 8 and small["summary"] is None
    big = SimpleNamespace(cluster=_cluster(1024))
    closed = comm.cluster_state(big)["cluster"]
    assert closed["processes"] == [] and closed["summary"]["by_state"] == {"alive": 1024}
    opened = comm.cluster_state(big, group=3)["cluster"]
    assert [p["rank"] for p in opened["processes"]] == list(range(96, 128))
    assert comm.cluster_state(big, group=99)["cluster"]["group"] is None


def _opened(n, v=comm.SCHEMA_VERSION):
    session = SimpleNamespace(cluster=_cluster(n))
    comms = comm.ClusterComms(session)
    sent = []
    fake = SimpleNamespace(send=sent.append, on_msg=lambda f: None, on_close=lambda f: None)
    comms.on_open(fake, {"content": {"data": {"v": v}}})
    return session, comms, sent


def _held(sent):
    """What a front end holds after every message sent so far."""
    state = None
    for msg in sent:
        if msg["type"] == "state":
            state = aggregate.held_state(msg)
        elif msg["type"] == "delta":
            state = aggregate.apply_delta(state, msg)
    return state


def test_the_front_end_opens_a_group():
    _, comms, sent = _opened(1024)
    comms.on_msg({"content": {"data": {"type": "group", "group": 2}}})
    assert sent[-1]["type"] == "delta" and sent[-1]["state"]["cluster"]["group"] == 2
    # The drill-down carries the group's rows and nothing else.
    assert sorted(sent[-1]["rows"]["rows"]) == list(range(64, 96))
    assert [p["rank"] for p in _held(sent)["cluster"]["processes"]] == list(range(64, 96))
    comms.on_msg({"content": {"data": {"type": "group", "group": None}}})
    assert sent[-1]["rows"]["gone"] == list(range(64, 96)) and sent[-1]["rows"]["rows"] == {}
    assert _held(sent)["cluster"]["processes"] == []


def test_pushes_after_the_first_send_only_what_changed():
    session, comms, sent = _opened(1024)
    assert sent[0]["type"] == "state" and sent[0]["state"]["cluster"]["summary"]
    comms.push()
    # Nothing changed: no rows, no summary, a few hundred bytes.
    (steady,) = sent[1:]
    assert steady["type"] == "delta" and "summary" not in steady
    assert steady["rows"]["rows"] == {} and len(json.dumps(steady)) < 1500
    session.cluster.processes[40].state = "dead"
    comms.push()
    assert sent[-1]["summary"]["by_state"] == {"alive": 1023, "dead": 1}
    held = _held(sent)
    assert held["cluster"]["summary"] == comm.cluster_state(session)["cluster"]["summary"]


def test_small_clusters_get_row_deltas_that_add_up_to_the_state():
    session, comms, sent = _opened(8)
    session.cluster.processes[3].state = "dead"
    comms.push()
    comms.push()
    assert list(sent[1]["rows"]["rows"]) == [3] and sent[2]["rows"]["rows"] == {}
    assert sorted(sent[2]["rows"]["ages"]) == list(range(8))
    want = comm.cluster_state(session)["cluster"]["processes"]
    assert _held(sent)["cluster"]["processes"] == want


def test_a_delta_on_another_version_is_refused():
    _, comms, sent = _opened(8)
    comms.push()
    with pytest.raises(ProtocolError, match="version"):
        aggregate.apply_delta({"_version": 99}, sent[-1])


def test_feed_sends_ages_of_the_shown_rows_only():
    feed = aggregate.RowFeed()
    first = feed.update(rows(4))
    assert (first["base"], sorted(first["rows"]), first["gone"]) == (0, [0, 1, 2, 3], [])
    assert "heartbeat_age" not in first["rows"][0] and first["ages"][1] == 1.4
    second = feed.update(rows(4)[2:])
    assert (second["base"], second["rows"], second["gone"]) == (first["v"], {}, [0, 1])
    assert sorted(second["ages"]) == [2, 3]
    held = aggregate.apply_rows(aggregate.apply_rows({}, first), second)
    assert held == {r["rank"]: r for r in rows(4)[2:]}


def test_a_fresh_heartbeat_does_not_change_the_summary():
    fresh = rows(128)
    for r in fresh:
        r["heartbeat_age"] = 1.3
    assert {g["oldest_heartbeat"] for g in aggregate.summarize(fresh)["groups"]} == {0}
    fresh[0]["heartbeat_age"] = 7.9
    assert aggregate.summarize(fresh)["groups"][0]["oldest_heartbeat"] == 7


def test_a_version_1_front_end_gets_whole_states():
    session, comms, sent = _opened(8, v=1)
    comms.push()
    assert [m["type"] for m in sent] == ["state", "state"]
    assert len(sent[-1]["state"]["cluster"]["processes"]) == 8
