"""Merging per-process Perfetto traces onto the kernel's clock (synthetic traces)."""

from __future__ import annotations

import gzip
import json

import pytest

from jaxsys_kernel.cells import timeline


def trace(mark_ts: float, extra: list[dict]) -> bytes:
    events = [
        {"ph": "M", "pid": 701, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 701, "tid": 5, "name": "thread_name", "args": {"name": "python"}},
        {"ph": "X", "pid": 701, "tid": 5, "ts": mark_ts, "dur": 1.0, "name": timeline.MARK},
        *extra,
    ]
    return gzip.compress(json.dumps({"traceEvents": events}).encode())


def span(name, ts, dur, tid=5, pid=701):
    return {"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "name": name}


def test_clocks_are_aligned_through_the_start_mark_and_the_offset():
    # p0 started its trace at kernel time 1000.0 s; p1's clock runs 0.5 s ahead and its
    # trace started 2 ms later (kernel time). Both ran f 100 us after their mark.
    traces = {
        0: timeline.Fetched(0, trace(10.0, [span("PjitFunction(f)", 110.0, 50.0)]), 1000.0),
        1: timeline.Fetched(1, trace(30.0, [span("PjitFunction(f)", 130.0, 80.0)]), 1000.502),
    }
    offsets = {0: timeline.Offset(0.0, 1e-4), 1: timeline.Offset(0.5, 2e-4)}
    merged = timeline.merge(traces, offsets)
    fs = {e["pid"]: e["ts"] for e in merged["traceEvents"] if e.get("name") == "PjitFunction(f)"}
    assert fs[1] == pytest.approx(100.0)
    assert fs[2] == pytest.approx(2100.0)
    names = {
        e["pid"]: e["args"]["name"]
        for e in merged["traceEvents"]
        if e.get("name") == "process_name"
    }
    assert names[1].startswith("p0 (clock +0.000 ms") and names[2].startswith(
        "p1 (clock +500.000 ms"
    )
    threads = [e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "thread_name"]
    assert "/host:CPU / python" in threads
    assert merged["metadata"]["jaxsys"]["clock_errors_s"] == {"0": 1e-4, "1": 2e-4}


def test_summary_keeps_executables_collectives_and_cell_lines_per_process():
    extra = [
        span("PjitFunction(step)", 100.0, 500.0),
        span("all-reduce.1", 150.0, 400.0, tid=6),
        span("$/tmp/ipykernel_123/4567.py:4 <module>", 90.0, 600.0),
        span("dce", 10.0, 5.0),
    ]
    traces = {0: timeline.Fetched(0, trace(0.0, extra), 50.0)}
    s = timeline.summary(timeline.merge(traces, {0: timeline.Offset(0.0, 0.0)}))
    spans = s["processes"][0]["spans"]
    assert [(x["kind"], x["name"]) for x in spans] == [
        ("line", "line 4"),
        ("executable", "step"),
        ("collective", "all-reduce.1"),
    ]
    assert s["processes"][0]["executable_us"] == 500.0 and s["end_us"] == 690.0


def test_a_trace_without_the_start_mark_is_refused():
    bad = gzip.compress(json.dumps({"traceEvents": [span("x", 1.0, 1.0)]}).encode())
    with pytest.raises(timeline.TraceRefused, match="no start mark"):
        timeline.merge({0: timeline.Fetched(0, bad, 0.0)}, {0: timeline.Offset(0.0, 0.0)})


def test_saved_file_opens_as_json(tmp_path):
    traces = {0: timeline.Fetched(0, trace(0.0, []), 1.0)}
    merged = timeline.merge(traces, {0: timeline.Offset(0.0, 0.0)})
    path = timeline.save(merged, tmp_path / "traces", "cell-1")
    with gzip.open(path, "rt") as f:
        assert json.load(f)["traceEvents"]
    assert "ui.perfetto.dev" in timeline.how_to_open(path)


def test_the_view_draws_a_static_svg_and_a_table_and_marks_the_slowest():
    from jaxsys_kernel.widgets.timeline import TimelineView, slowest, timeline_svg

    info = {
        "kind": "timeline",
        "end_us": 1000.0,
        "processes": [
            {
                "rank": 0,
                "executable_us": 100.0,
                "spans": [{"kind": "executable", "name": "step", "start": 0.0, "dur": 100.0}],
            },
            {
                "rank": 1,
                "executable_us": 900.0,
                "spans": [
                    {"kind": "executable", "name": "step", "start": 0.0, "dur": 900.0},
                    {"kind": "line", "name": "line 3", "start": 0.0, "dur": 950.0},
                ],
            },
        ],
    }
    assert slowest(info) == 1
    data, _ = TimelineView(info)._repr_mimebundle_()
    svg = timeline_svg(info)
    assert svg.startswith("<svg") and "p1 (slowest)" in svg and "p0 step: 0.100 ms" in svg
    assert data["text/plain"].splitlines() == [
        "p0: 0.100 ms in executables; longest step 0.100 ms",
        "p1: 0.900 ms in executables; longest step 0.900 ms",
    ]
    with pytest.raises(Exception, match="timeline"):
        TimelineView({"kind": "mesh"})


def test_the_process_that_starts_its_steps_late_is_the_one_marked():
    # p3 spends its time in Python before each step; the others wait for it inside the
    # step (a collective in the executable), so they spend the most time in executables.
    from jaxsys_kernel.widgets.timeline import slowest

    def proc(rank, late_by, busy):
        spans = [
            {"kind": "executable", "name": "step", "start": k * 1000.0 + late_by, "dur": busy}
            for k in range(3)
        ]
        return {"rank": rank, "executable_us": 3 * busy, "spans": spans}

    info = {"kind": "timeline", "end_us": 3000.0}
    info["processes"] = [proc(0, 0.0, 800.0), proc(1, 0.0, 810.0), proc(3, 700.0, 100.0)]
    assert slowest(info) == 3
