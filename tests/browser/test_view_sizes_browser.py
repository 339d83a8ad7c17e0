"""Each view's own module draws in chromium, sized to its content, with labels that fit.

The modules are loaded exactly as anywidget loads them (``_esm`` from a blob URL) and drawn
from trait values the engines' summaries produce, so what is measured is what a notebook shows.
"""

from __future__ import annotations

import json

import pytest

from jaxsys_kernel.engine.summaries import (
    FakeNamedSharding,
    fake_devices,
    fake_mesh,
    mesh_info,
    sharding_info,
)
from jaxsys_kernel.widgets import CacheView, LiveDevicesView, MeshView, ShardingView

from . import available, launch, screenshot

REASON = available()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

# A stand-in for anywidget's front end: import the module from a blob URL and render it into
# a fresh element with a model holding the widget's state.
PAGE = """<html><head><style>%s</style></head><body style="width:1000px;margin:8px">
<script type="module">
window.show = async (id, code, state) => {
  const url = URL.createObjectURL(new Blob([code], { type: "text/javascript" }));
  const mod = await import(url);
  const model = { get: (k) => state[k], set: (k, v) => { state[k] = v; }, save_changes() {},
    on() {}, off() {}, send() {} };
  const el = document.createElement("div");
  el.id = id;
  el.style.marginBottom = "16px";
  document.body.append(el);
  mod.default.render({ model, el });
};
window.ready = true;
</script></body></html>"""


def _views() -> dict:
    mesh8 = fake_mesh(fake_devices(8, 4), (4, 2), ("x", "y"))
    mesh16 = fake_mesh(fake_devices(16, 4), (4, 4), ("x", "y"))
    huge = fake_mesh(fake_devices(4098, 2049), (4098,), ("x",))
    mesh3 = fake_mesh(fake_devices(16, 4), (2, 2, 4), ("a", "b", "c"))

    def sharding(mesh, spec, shape, **kw):
        return ShardingView(
            sharding_info((FakeNamedSharding(mesh, spec), shape), dtype="float32"), **kw
        )

    return {
        "mesh": MeshView(mesh_info(mesh8)),
        "grid": sharding(mesh16, ("x", "y"), (4, 4)),
        "scalar": sharding(huge, (), ()),
        "vector": sharding(mesh8, ("x",), (8,)),
        "cube": sharding(mesh3, ("a", "b", "c"), (4, 4, 8), dims=(1, 2)),
        "cache": CacheView([{"rank": 0, "requests": 4, "hits": 3}]),
        "live": LiveDevicesView(
            [{"rank": 0, "state": "alive", "heartbeat_age": 0.2, "devices": [0]}]
        ),
    }


# Per view: its drawing's box, its blocks' boxes and labels, and its caption lines.
MEASURE = """(id) => {
  const root = document.getElementById(id);
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; };
  const drawing = root.querySelector(".jxs-blocks, .jxs-mesh-grid, canvas");
  return {
    error: root.querySelector(".jxs-error")?.textContent || null,
    drawing: drawing ? box(drawing) : null,
    blocks: [...root.querySelectorAll(".jxs-block, .jxs-cell")].map((b) => ({
      box: box(b),
      labels: [...b.querySelectorAll("span, small, b")].filter((l) => l.textContent)
        .map((l) => ({ text: l.textContent, box: box(l),
          size: parseFloat(getComputedStyle(l).fontSize) })),
    })),
    text: [...root.querySelectorAll(".jxs-title, .jxs-muted")].map((e) => e.textContent),
  };
}"""


def _inside(inner, outer, slack=1.0) -> bool:
    x, y, w, h = inner
    ox, oy, ow, oh = outer
    return (
        x >= ox - slack
        and y >= oy - slack
        and x + w <= ox + ow + slack
        and y + h <= oy + oh + slack
    )


def test_views_are_sized_to_content_with_labels_that_fit():
    css = MeshView().get_state()["_css"]
    views = _views()
    with launch(width=1100, height=900) as page:
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.set_content(PAGE % css)
        page.wait_for_function("window.ready === true")
        for name, view in views.items():
            state = json.loads(json.dumps(view.get_state(), default=str))
            page.evaluate("([i, c, s]) => window.show(i, c, s)", [name, state["_esm"], state])
        page.wait_for_function("document.querySelectorAll('.jxs-root').length === 7")
        got = {name: page.evaluate(MEASURE, name) for name in views}
        screenshot(page, "view-sizes.png")
    assert errors == [] and all(g["error"] is None for g in got.values()), (errors, got)

    # A 4 x 4 array split 16 ways: 16 blocks of 96 x 52, not a 760 x 480 area.
    _, _, w, h = got["grid"]["drawing"]
    assert (w, h) == (384, 208), got["grid"]["drawing"]
    assert len(got["grid"]["blocks"]) == 16
    for block in got["grid"]["blocks"] + got["mesh"]["blocks"] + got["cube"]["blocks"]:
        assert block["labels"], block
        for label in block["labels"]:
            assert label["size"] >= 11, label
            assert _inside(label["box"], block["box"]), (label, block["box"])
    assert got["grid"]["blocks"][5]["labels"][0]["text"] == "d5"

    # A scalar replicated on 4,098 devices: one block, its label inside it, no dims named.
    (scalar,) = got["scalar"]["blocks"]
    assert all(_inside(lab["box"], scalar["box"]) for lab in scalar["labels"]), scalar
    assert scalar["labels"][0]["text"] == "d0-4097", scalar
    assert got["scalar"]["drawing"][3] <= 60, got["scalar"]["drawing"]
    assert not any("dim" in t for t in got["scalar"]["text"]), got["scalar"]["text"]
    assert any(t.startswith("one value") for t in got["scalar"]["text"]), got["scalar"]["text"]

    # Captions name what is drawn for ranks 1 and 3.
    assert not any("not drawn" in t for t in got["vector"]["text"]), got["vector"]["text"]
    assert any("not drawn — dim 0: 2 blocks" in t for t in got["cube"]["text"]), got["cube"]
    assert got["mesh"]["drawing"][2] <= 2 * 64 + 8, got["mesh"]["drawing"]
