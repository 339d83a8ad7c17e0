"""A merged four-process trace opens in the timeline view in chromium: one row per process,
the slowest marked, a span named on hover, and the wheel zooming in.

The traces are synthetic Perfetto traces merged by the real ``cells.timeline.merge``; the
view's module is loaded as anywidget loads it, from the state a real TimelineView holds.
"""

from __future__ import annotations

import gzip
import json

import pytest

from jaxsys_kernel.cells import timeline
from jaxsys_kernel.widgets.timeline import TimelineView

from . import available, launch, screenshot

REASON = available()

# SVG text has no inner text: what each label says, in order.
TEXTS = "() => [...document.querySelectorAll('#out svg text')].map((t) => t.textContent)"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

PAGE = """<html><body style="width:1000px;margin:8px"><div id="out"></div>
<script type="module">
window.show = async (code, state) => {
  const url = URL.createObjectURL(new Blob([code], { type: "text/javascript" }));
  const mod = await import(url);
  const model = { get: (k) => state[k], on() {}, off() {}, send() {} };
  mod.default.initialize?.({ model });
  mod.default.render({ model, el: document.getElementById("out") });
};
window.ready = true;
</script></body></html>"""


def _trace(rank: int, step_us: float) -> bytes:
    """Process ``rank``'s trace: its cell line, a step of ``step_us``, then an all-reduce."""
    pid = 700 + rank
    events = [
        {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": pid, "tid": 5, "name": "thread_name", "args": {"name": "python"}},
        {"ph": "X", "pid": pid, "tid": 5, "ts": 0.0, "dur": 1.0, "name": timeline.MARK},
        {
            "ph": "X",
            "pid": pid,
            "tid": 5,
            "ts": 5.0,
            "dur": 1100.0,
            "name": "$/tmp/ipykernel_1/2.py:3 <module>",
        },
        {"ph": "X", "pid": pid, "tid": 5, "ts": 10.0, "dur": step_us, "name": "PjitFunction(step)"},
        {
            "ph": "X",
            "pid": pid,
            "tid": 6,
            "ts": 10.0 + step_us,
            "dur": 1000.0 - step_us,
            "name": "all-reduce.1",
        },
    ]
    return gzip.compress(json.dumps({"traceEvents": events}).encode())


def test_a_merged_four_process_trace_opens_in_the_timeline_view():
    # p2 computes nine times longer than the others, which then wait in the all-reduce.
    steps = {0: 100.0, 1: 100.0, 2: 900.0, 3: 100.0}
    traces = {r: timeline.Fetched(r, _trace(r, us), 1000.0) for r, us in steps.items()}
    merged = timeline.merge(traces, {r: timeline.Offset(0.0, 1e-4) for r in steps})
    view = TimelineView(timeline.summary(merged))
    state = json.loads(json.dumps(view.get_state()))
    with launch(width=1000, height=400) as page:
        page.set_content(PAGE)
        page.wait_for_function("window.ready === true")
        page.evaluate("([c, s]) => window.show(c, s)", [view._esm, state])
        page.wait_for_function("document.querySelectorAll('#out svg text').length >= 5")
        labels = page.evaluate(TEXTS)
        rows = [t for t in labels if t.startswith("p")]
        assert rows == ["p0", "p1", "p2 (slowest)", "p3"], rows
        # Per process: the cell line, the step and the all-reduce.
        assert page.locator("#out svg rect").count() == 4 * 3
        axis_before = labels[-1]
        assert "kernel clock" in axis_before, labels
        page.locator("#out svg rect").nth(7).hover()
        tip = page.locator("#out > div").inner_text()
        assert tip.startswith("p2 ") and "ms at" in tip, tip
        screenshot(page, "timeline-four-processes.png")
        page.locator("#out svg").hover()
        page.mouse.wheel(0, -300)
        page.wait_for_function(
            "(before) => [...document.querySelectorAll('#out svg text')].pop().textContent"
            " !== before",
            arg=axis_before,
        )
