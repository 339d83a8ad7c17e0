"""The live and cache views send changes, not whole lists, and summarise large clusters."""

import json

from jaxsys_kernel.telemetry import aggregate
from jaxsys_kernel.widgets import CacheView, LiveDevicesView
from tests.fakes import FakeComm


def live_rows(n, dead=()):
    return [
        {
            "rank": r,
            "state": "dead" if r in dead else "alive",
            "heartbeat_age": 0.3,
            "busy": False,
            "devices": [r],
            "incarnation": 1,
        }
        for r in range(n)
    ]


def attach(view):
    view.comm = FakeComm()
    return view.comm


def customs(comm):
    return [m["content"] for m in comm.sent if m.get("method") == "custom"]


def front_end_sets(view, **state):
    """What the JS sends after model.set(...); model.save_changes()."""
    msg = {"method": "update", "state": state, "buffer_paths": []}
    view._handle_msg({"content": {"data": msg}, "buffers": []})


def test_a_changed_row_is_sent_alone_and_the_trait_is_not_resent():
    view = LiveDevicesView(live_rows(8))
    comm = attach(view)
    view.update(live_rows(8, dead={3}), append=["p3: alive -> dead"])
    (msg,) = comm.sent
    delta = msg["content"]
    assert msg["method"] == "custom" and delta["type"] == "rows"
    assert list(delta["rows"]) == [3] and delta["rows"][3]["state"] == "dead"
    assert sorted(delta["ages"]) == list(range(8))
    assert delta["log"]["append"] == ["p3: alive -> dead"]
    # Python's traits are current (a page that reloads gets them whole).
    assert view.liveness[3]["state"] == "dead" and view.event_log == ["p3: alive -> dead"]
    assert view.rows_version == delta["v"] and delta["base"] == delta["v"] - 1


def test_applied_deltas_give_the_rows_python_holds():
    view = LiveDevicesView(live_rows(8))
    comm = attach(view)
    held = {r["rank"]: r for r in view.get_state()["liveness"]}
    for step in range(4):
        view.update(live_rows(8 - step, dead={step}))
    for delta in customs(comm):
        held = aggregate.apply_rows(held, delta)
    assert [held[r] for r in sorted(held)] == view.liveness


def test_steady_updates_stay_small():
    view = LiveDevicesView(live_rows(64))
    comm = attach(view)
    view.update(live_rows(64))
    (delta,) = customs(comm)
    assert delta["rows"] == {} and len(json.dumps(delta)) < 64 * 16


def test_above_the_group_size_a_summary_and_the_open_groups_rows():
    view = LiveDevicesView(live_rows(256, dead={20}))
    comm = attach(view)
    assert view.liveness == [] and len(view.summary["groups"]) == aggregate.MAX_GROUPS
    assert view.summary["by_state"] == {"alive": 255, "dead": 1}
    assert len(view.records) == 256
    front_end_sets(view, open_group=2)
    (delta,) = customs(comm)
    assert sorted(delta["rows"]) == list(range(16, 24)) and sorted(delta["ages"]) == list(
        range(16, 24)
    )
    assert [p["rank"] for p in view.liveness] == list(range(16, 24))
    # An update sends the open group's ages, never 256 rows.
    view.update(live_rows(256, dead={20, 200}))
    last = customs(comm)[-1]
    assert last["rows"] == {} and len(last["ages"]) == 8
    assert view.summary["by_state"] == {"alive": 254, "dead": 2}
    front_end_sets(view, open_group=None)
    assert customs(comm)[-1]["gone"] == list(range(16, 24)) and view.liveness == []


def test_a_front_end_on_another_version_gets_the_rows_whole():
    view = LiveDevicesView(live_rows(4))
    comm = attach(view)
    view._handle_msg(
        {"content": {"data": {"method": "custom", "content": {"type": "resync"}}}, "buffers": []}
    )
    (msg,) = comm.sent
    assert msg["method"] == "update" and len(msg["state"]["liveness"]) == 4


def test_cache_view_groups_large_clusters():
    stats = [{"rank": r, "requests": 2, "hits": 1, "compiles": 1, "bytes": r} for r in range(100)]
    view = CacheView(stats)
    comm = attach(view)
    groups = view.summary["groups"]
    assert view.stats == [] and len(groups) == 25 and groups[0]["ranks"] == "0-3"
    assert groups[0]["requests"] == 8 and groups[-1]["bytes"] == 99
    front_end_sets(view, open_group=1)
    assert [s["rank"] for s in view.stats] == [4, 5, 6, 7]
    (delta,) = customs(comm)
    assert "ages" not in delta and sorted(delta["rows"]) == [4, 5, 6, 7]
    assert "p99" in view.static()["text/plain"]
