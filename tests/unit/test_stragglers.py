"""The straggler analysis, driven by synthetic step records on skewed clocks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxsys_kernel.cells import step_records
from jaxsys_kernel.cells.step_records import BadStep
from jaxsys_kernel.cells.stragglers import CATEGORIES, Stragglers, analyse_step
from jaxsys_kernel.cells.stragglers_view import render

pytestmark = pytest.mark.unit

STEP = 0.1  # seconds of device work per step


def run(nprocs, steps, slow=None, delay=0.2, where="host", offsets=None, jitter=None):
    """Records of ``steps`` synchronous steps; ``slow`` loses ``delay`` s in ``where``.

    Each process's stamps are on its own clock (``offsets``); the collective ends when the
    last process arrives plus the device work.
    """
    offsets = offsets or {}
    jitter = jitter or (lambda r, s: 0.0)
    out, t = [], 1000.0
    for s in range(steps):
        recs = {}
        for r in range(nprocs):
            extra = delay if r == slow else 0.0
            parts = {"input": 0.005, "host": 0.002 + jitter(r, s), "compile": 0.0, "compute": 0.0}
            parts[where] = parts.get(where, 0.0) + extra
            begin = t + (extra if where == "start" else 0.0)
            dispatch = begin + parts["input"] + parts["host"]
            recs[r] = (begin, dispatch, parts)
        last = max(d + p["compile"] + p["compute"] for _, d, p in recs.values())
        end = last + STEP
        for r, (begin, dispatch, p) in recs.items():
            off = offsets.get(r, 0.0)
            out.append(
                (
                    r,
                    {
                        "kind": "step",
                        "step": s,
                        "start": begin + off,
                        "dispatch": dispatch + off,
                        "end": end + off,
                        "input": p["input"],
                        "compile": p["compile"],
                        "compute": p["compute"],
                    },
                )
            )
        t = end
    return out


def feed(view, records):
    for r, rec in records:
        view.add(r, rec)
    return view


@pytest.mark.parametrize("where", ["input", "host", "compile", "compute", "start"])
def test_a_delay_is_named_with_its_category(where):
    offsets = {0: 0.0, 1: 3.7, 2: -12.5, 3: 0.4}
    view = feed(Stragglers(range(4), offsets), run(4, 6, slow=2, where=where, offsets=offsets))
    assert view.named() == (2, where)
    f = view.findings[-1]
    assert f.named and f.last == 2 and f.late == pytest.approx(0.2, abs=1e-6)
    # The others waited the delay inside the collective; the slow one did not wait.
    assert f.parts[0]["wait"] == pytest.approx(0.2, abs=1e-6)
    assert f.parts[2]["wait"] == pytest.approx(0.0, abs=1e-9)


def test_uncorrected_clock_offsets_would_mislead():
    offsets = {0: 0.0, 1: 5.0}
    records = run(2, 5, slow=None, offsets=offsets)
    assert feed(Stragglers([0, 1], offsets), records).named() is None
    # The same records read without the offsets blame the process whose clock runs ahead.
    assert feed(Stragglers([0, 1]), records).named() is not None


@settings(max_examples=60, deadline=None)
@given(
    nprocs=st.integers(2, 40),
    seed=st.integers(0, 10_000),
    skew=st.floats(-100, 100),
)
def test_no_false_name_in_an_undisturbed_run(nprocs, seed, skew):
    def jitter(r, s):
        return ((r * 7919 + s * 104729 + seed) % 1000) / 1000 * 0.004

    offsets = {r: skew * (r % 3) for r in range(nprocs)}
    view = feed(Stragglers(range(nprocs), offsets), run(nprocs, 5, jitter=jitter, offsets=offsets))
    assert len(view.findings) == 5
    assert not any(f.named for f in view.findings)
    assert view.named() is None


@settings(max_examples=60, deadline=None)
@given(
    nprocs=st.integers(2, 40),
    data=st.data(),
    where=st.sampled_from(CATEGORIES),
    delay=st.floats(0.06, 5.0),
)
def test_any_delayed_process_is_named_whatever_the_order_of_records(nprocs, data, where, delay):
    slow = data.draw(st.integers(0, nprocs - 1))
    records = run(nprocs, 5, slow=slow, delay=delay, where=where)
    records = data.draw(st.permutations(records))
    view = feed(Stragglers(range(nprocs)), records)
    assert len(view.findings) == 5
    assert view.named() == (slow, where)


def test_bad_records_are_refused_with_the_field_and_the_process_left_out():
    view = Stragglers([0, 1])
    good = run(2, 1)
    bad = dict(good[0][1], input=float("nan"))
    view.add(0, bad)
    assert "input" in view.refused[0]
    view.add(0, good[0][1])  # refused for the rest of the cell
    view.add(1, good[1][1])
    assert view.findings == []
    assert "p0's records were refused: input is nan, not a finite number" in render(view)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"step": -1}, "step"),
        ({"step": True}, "step"),
        ({"input": "1"}, "input"),
        ({"compile": -0.5}, "compile"),
        ({"compute": 1e9}, "compute"),
        ({"end": 0.0}, "order"),
        ({"kind": "dispatch"}, "kind"),
        ({"input": 50.0}, "input"),
    ],
)
def test_checked_names_the_bad_field(change, field):
    rec = dict(run(1, 1)[0][1], **change)
    with pytest.raises(BadStep, match=field):
        step_records.checked(rec)


def test_a_process_not_in_the_cell_and_unmatched_steps_are_bounded(monkeypatch):
    from jaxsys_kernel.cells import stragglers

    monkeypatch.setattr(stragglers, "MAX_PENDING", 3)
    view = Stragglers([0, 1])
    assert view.add(7, run(1, 1)[0][1]) is None
    for r, rec in run(2, 10):
        if r == 0:
            view.add(r, rec)
    assert len(view.pending) <= 4 and view.dropped > 0


def test_one_process_alone_is_never_named():
    f = analyse_step(0, {0: step_records.checked(run(1, 1)[0][1])})
    assert not f.named


def test_the_text_view_names_the_straggler_and_summarises_many_processes():
    view = feed(Stragglers(range(64)), run(64, 12, slow=41, where="input"))
    text = render(view)
    assert text.startswith("jaxsys: p41 held the others up, in input (12 steps)")
    assert "(2 earlier steps not listed)" in text
    assert "step 11: p41 arrived last, late by 200.0 ms in input" in text
    assert text.splitlines()[13].lstrip().startswith("p41")  # waited least: listed first
    assert "54 more processes" in text
    assert sum(int(line.split()[-1]) for line in text.splitlines() if " .. " in line) == 64
    quiet = render(feed(Stragglers(range(3)), run(3, 3)))
    assert "no process held the others up" in quiet and "within the noise" in quiet
    assert "no step" in render(Stragglers([0, 1]))


def test_at_1024_processes_the_view_names_the_one_and_stays_short():
    import time

    t0 = time.perf_counter()
    view = feed(Stragglers(range(1024)), run(1024, 5, slow=977, where="compile"))
    text = render(view)
    took = time.perf_counter() - t0
    assert view.named() == (977, "compile")
    assert len(text.splitlines()) < 40, text
    assert "1014 more processes" in text
    assert took < 10, took


def test_the_picture_draws_a_bar_per_listed_process_with_tooltips():
    import xml.etree.ElementTree as ET

    from jaxsys_kernel.cells.stragglers_svg import where_svg

    svg = where_svg(feed(Stragglers(range(64)), run(64, 5, slow=3, where="host")))
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    labels = [t.text for t in root.iter(f"{ns}text")]
    assert labels[0].startswith("p3 held the others up, in host")
    assert sum(1 for x in labels if x and x[0] == "p" and x[1:].isdigit()) == 10
    tips = [t.text for t in root.iter(f"{ns}title")]
    assert "p3 host 202.0 ms" in tips


def test_a_different_late_process_at_each_step_names_no_one():
    # A busy machine: at each step another process is 100 ms late.
    records = []
    for s, late in enumerate([3, 1, 2, 0, 3]):
        step = run(4, 1, slow=late, delay=0.1, where="host")
        for r, rec in step:
            shift = s * 10.0
            rec = dict(rec, step=s, start=rec["start"] + shift)
            rec.update(dispatch=rec["dispatch"] + shift, end=rec["end"] + shift)
            records.append((r, rec))
    view = feed(Stragglers(range(4)), records)
    assert all(f.named for f in view.findings)
    assert view.named() is None
    assert "no process held the others up" in render(view)
