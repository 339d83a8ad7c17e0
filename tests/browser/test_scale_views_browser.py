"""The live-devices view of 256 processes in chromium: groups of ranks, and a drill-down.

The view's module is loaded as anywidget loads it, from the state a real LiveDevicesView
holds; the model stand-in answers a group opened on the page with what the Python view sends
for it (the rows message), so both halves of the drill-down are the real ones.
"""

from __future__ import annotations

import json

import pytest

from jaxsys_kernel.widgets import LiveDevicesView
from tests.fakes import FakeComm

from . import available, launch, screenshot

REASON = available()

pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

PAGE = """<html><body style="width:1000px;margin:8px"><div id="out"></div>
<script type="module">
window.show = async (code, state) => {
  const url = URL.createObjectURL(new Blob([code], { type: "text/javascript" }));
  const mod = await import(url);
  const handlers = {};
  window.saved = [];
  const model = {
    get: (k) => state[k],
    set: (k, v) => { state[k] = v; for (const cb of handlers[`change:${k}`] || []) cb(); },
    save_changes: () => window.saved.push(state.open_group),
    send() {},
    on: (ev, cb) => { (handlers[ev] ||= []).push(cb); },
    off() {},
  };
  window.deliver = (msg) => { for (const cb of handlers["msg:custom"] || []) cb(msg); };
  // As anywidget does: the model's own set-up first, then a view.
  mod.default.initialize?.({ model });
  mod.default.render({ model, el: document.getElementById("out") });
};
window.ready = true;
</script></body></html>"""


def _rows(n, dead=()):
    return [
        {
            "rank": r,
            "state": "dead" if r in dead else "alive",
            "heartbeat_age": 0.4,
            "busy": False,
            "devices": [r],
            "incarnation": 1,
        }
        for r in range(n)
    ]


def test_live_view_of_256_processes_shows_groups_and_drills_into_one():
    view = LiveDevicesView(_rows(256, dead={42}))
    view.comm = FakeComm()
    state = json.loads(json.dumps(view.get_state()))
    with launch() as page:
        page.set_content(PAGE)
        page.wait_for_function("window.ready === true")
        page.evaluate("([c, s]) => window.show(c, s)", [view._esm, state])
        groups = page.locator(".jxs-group")
        page.wait_for_function("document.querySelectorAll('.jxs-group').length === 32")
        assert groups.nth(0).inner_text() == "p0-7: 8 alive"
        assert groups.nth(5).inner_text() == "p40-47: 7 alive, 1 dead"
        assert page.locator(".jxs-live-row").count() == 0
        groups.nth(5).click()
        assert page.evaluate("window.saved") == [5]
        # The kernel's side: the group opened, and what the view sends for it.
        view.open_group = 5
        (delta,) = [m["content"] for m in view.comm.sent if m.get("method") == "custom"]
        page.evaluate("(m) => window.deliver(m)", json.loads(json.dumps(delta)))
        page.wait_for_function("document.querySelectorAll('.jxs-live-row').length === 8")
        rows = page.locator(".jxs-live-row")
        assert rows.nth(2).locator(".jxs-state").inner_text() == "dead"
        assert "all groups" in page.locator(".jxs-groups-back").inner_text()
        screenshot(page, "live_view_256_groups.png")
