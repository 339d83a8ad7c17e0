"""The data-plan view's front end in headless chromium, driven by a stand-in widget model.

No Lab and no kernel: the page imports ``dataplan.js`` as anywidget would and renders a
plan's summary; clicking a process row must select it and outline what it reads. The
static SVG fallback is drawn in the same page.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from jaxsys_kernel.data.planner import plan
from jaxsys_kernel.engine.simulate import FakeNamedSharding, fake_devices, fake_mesh

from ..browser import available, launch

REASON = available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

STATIC = Path(__file__).parents[2] / "jaxsys_kernel" / "widgets" / "static"

PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>{css}</style></head>
<body><div id="view" style="width: 900px"></div><div id="svg">{svg}</div>
<script type="module">
import view from "data:text/javascript;base64,{js}";
const state = {state};
const handlers = {{}};
window.model = {{
  get: (k) => state[k],
  set: (k, v) => {{ state[k] = v; (handlers["change:" + k] || []).forEach((f) => f()); }},
  save_changes: () => {{ window.saved = (window.saved || 0) + 1; }},
  on: (e, f) => {{ (handlers[e] = handlers[e] || []).push(f); }},
  off: () => {{}},
}};
view.render({{ model: window.model, el: document.getElementById("view") }});
window.rendered = true;
</script></body></html>"""


def test_plan_view_draws_blocks_rows_and_selection():
    # Each copy split over two processes: p0 and p1 read the first half, p2 and p3 the second.
    sharding = FakeNamedSharding(fake_mesh(fake_devices(8, 2), (2, 4), ("data", "copy")), ("data",))
    p = plan((512, 1024), sharding, "float32")
    state = {"info": p.summary(), "selected_process": None, "_view_kind": "dataplan"}
    html = PAGE.format(
        css=(STATIC / "views.css").read_text(),
        svg=p.svg(),
        js=base64.b64encode((STATIC / "dataplan.js").read_bytes()).decode(),
        state=json.dumps(state),
    )
    with launch(width=1000, height=900) as page:
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.set_content(html)
        page.wait_for_function("window.rendered === true", timeout=20_000)
        root = page.locator("#view .jxs-dataplan")
        assert "float32[512, 1024]" in root.locator(".jxs-title").inner_text()
        # Two distinct blocks (the halves), each read by two processes.
        main = root.locator(".jxs-plot .jxs-block")
        assert main.count() == 2
        assert main.nth(0).get_attribute("title").endswith("read by p0-1 · ×4 replicated")
        rows = root.locator(".jxs-dp-row")
        assert rows.count() == 4
        assert "1.0 MiB (50%) · 1 read, 1 run · same data as p1" in rows.nth(0).inner_text()
        rows.nth(2).click()
        page.wait_for_function("window.model.get('selected_process') === 2", timeout=5_000)
        outline = root.locator(".jxs-read")
        outline.wait_for(timeout=5_000)
        assert outline.get_attribute("title") == "p2 reads [256:512, 0:1024]: 1.0 MiB"
        assert "jxs-off" in (root.locator(".jxs-plot .jxs-block").nth(0).get_attribute("class"))
        assert page.evaluate("window.saved") == 1
        # The static fallback: one filled rectangle per reader stripe at least.
        assert page.locator("#svg svg rect").count() > 8
        assert not errors, errors
