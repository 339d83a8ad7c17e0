"""Summaries of many processes keep their size; deltas carry only what changed."""

import json
from types import SimpleNamespace

from jaxsys_kernel.cluster.records import ProcessInfo
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


def test_the_front_end_opens_a_group():
    comms = comm.ClusterComms(SimpleNamespace(cluster=_cluster(1024)))
    sent = []
    fake = SimpleNamespace(send=sent.append, on_msg=lambda f: None, on_close=lambda f: None)
    comms.on_open(fake)
    comms.on_msg({"content": {"data": {"type": "group", "group": 2}}})
    assert sent[-1]["state"]["cluster"]["group"] == 2
    assert len(sent[-1]["state"]["cluster"]["processes"]) == 32
    comms.on_msg({"content": {"data": {"type": "group", "group": None}}})
    assert sent[-1]["state"]["cluster"]["processes"] == []
