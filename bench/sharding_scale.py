"""How mesh and sharding views scale with the number of devices: build, payload and render.

What is measured
----------------
For 64, 512 and 4096 simulated devices (eight per process, so 8, 64 and 512 processes) the
benchmark builds three summaries with the duck-typed descriptors of
:mod:`jaxsys_kernel.engine.summaries` (no JAX, no hardware):

*mesh*: ``mesh_info`` of a 2-D mesh ``("a", "b")`` of the devices (8 x 8, 16 x 32, 64 x 64).

*sharded*: ``sharding_info`` of a float32 array of 32 x 32 elements per device, split over
both mesh axes with ``P("a", "b")``: one distinct block per device.

*replicated*: the same array with ``P("a", None)``: split over ``a`` and replicated over
``b``, so each block is held by a whole row of the mesh.

*build* is the wall time of the ``mesh_info`` / ``sharding_info`` call (for a sharding that
includes computing the fake ``devices_indices_map``, which JAX would do for a real array),
the median of several calls after one untimed call. *payload* is ``len(json.dumps(summary))``,
the size of the widget's synced trait, also given per device: it must stay flat as the
device count grows (O(devices)).

*render* is measured in headless Chromium (Debian's ``/usr/bin/chromium``, started by
playwright with the flags of ``tests/browser.py``). A small HTML page, served by a
``http.server`` on 127.0.0.1 from a thread of this process, loads the package's own
``jaxsys_kernel/widgets/static/views.js`` and ``views.css``. For each summary the page
creates a 1000 px wide element and calls the module's ``render({model, el})`` with a
minimal stand-in for anywidget's model (``get``, ``set``, ``on``, ``off``,
``save_changes`` over a plain object holding the traits). ``performance.now()`` is read
before the call, after it returns (*sync*), and once the next animation frame has been
produced (a ``setTimeout(0)`` queued from ``requestAnimationFrame``, so style, layout and
paint of the new DOM are included: *frame*). The median of several renders, each into a
fresh element, is reported, with what was drawn (labelled HTML cells or blocks, or a
canvas).

Targets
-------
At 4096 devices: every summary built in at most 100 ms, payload O(devices) (bytes per
device roughly constant from 64 to 4096 devices), every view rendered, through the next
frame, in at most 300 ms. The script reports and never fails on the targets; it exits
non-zero only when the benchmark itself could not run (e.g. a view drew an error).

Usage
-----
``python bench/sharding_scale.py [--quick] [--reps N] [--sizes 64,512,4096]
[--screenshot-dir DIR]``; ``--quick`` takes 3 samples of each instead of 7.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from jaxsys_kernel.engine.summaries import (  # noqa: E402
    FakeNamedSharding,
    fake_devices,
    fake_mesh,
    mesh_info,
    sharding_info,
)
from tests.browser import CHROMIUM, CHROMIUM_FLAGS, available  # noqa: E402

STATIC = ROOT / "jaxsys_kernel" / "widgets" / "static"
DEVICES_PER_PROCESS = 8
ELEMENTS_PER_DEVICE_DIM = 32
BUILD_TARGET_MS = 100.0
RENDER_TARGET_MS = 300.0
PAGE_TIMEOUT_S = 60.0
STAGE_WIDTH_PX = 1000

PAGE = f"""<!doctype html>
<html>
<head>
<meta charset="utf-8">
<link rel="stylesheet" href="views.css">
<style>
  body {{ margin: 8px; background: #fff; }}
  #stage > div {{ width: {STAGE_WIDTH_PX}px; margin-bottom: 16px; }}
</style>
<script type="module">
  import views from "./views.js";
  window.jxsViews = views;
  window.jxsReady = true;
</script>
</head>
<body><div id="stage"></div></body>
</html>
"""

# One render of a view per call; the element is left in the page for a screenshot.
RENDER_JS = """
async ({ kind, info, keep }) => {
  const nextFrame = () =>
    new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
  const stage = document.getElementById("stage");
  stage.replaceChildren();
  const el = document.createElement("div");
  stage.append(el);
  const state = { _view_kind: kind, info, dims: [0, 1], selected_process: null };
  const handlers = new Map();
  const model = {
    get: (name) => state[name],
    set: (name, value) => { state[name] = value; },
    save_changes: () => {},
    on: (event, cb) => { handlers.set(event, [...(handlers.get(event) || []), cb]); },
    off: (event, cb) => {
      handlers.set(event, (handlers.get(event) || []).filter((f) => cb && f !== cb));
    },
  };
  await nextFrame();  // start from a quiet page
  const t0 = performance.now();
  const cleanup = window.jxsViews.render({ model, el });
  const t1 = performance.now();
  await nextFrame();
  const t2 = performance.now();
  const drawn = {
    cells: el.querySelectorAll(".jxs-cell").length,
    blocks: el.querySelectorAll(".jxs-block").length,
    canvases: el.querySelectorAll("canvas").length,
    errors: [...el.querySelectorAll(".jxs-error")].map((e) => e.textContent),
    height: el.getBoundingClientRect().height,
  };
  if (!keep && typeof cleanup === "function") cleanup();
  return { sync: t1 - t0, frame: t2 - t0, drawn };
}
"""


class BenchError(RuntimeError):
    """The benchmark could not run as intended."""


def mesh_shape(n: int) -> tuple[int, int]:
    """A 2-D mesh shape for ``n`` devices (a power of two), as square as it gets."""
    b = 2 ** math.ceil(math.log2(n) / 2)
    return n // b, b


def make_cases(n: int):
    """The three summaries for ``n`` devices, as (name, builder) pairs."""
    devs = fake_devices(n, DEVICES_PER_PROCESS)
    a, b = mesh_shape(n)
    mesh = fake_mesh(devs, (a, b), ("a", "b"))
    shape = (a * ELEMENTS_PER_DEVICE_DIM, b * ELEMENTS_PER_DEVICE_DIM)
    return (a, b), [
        ("mesh", lambda: mesh_info(mesh)),
        (
            "sharded",
            lambda: sharding_info((FakeNamedSharding(mesh, ("a", "b")), shape), dtype="float32"),
        ),
        (
            "replicated",
            lambda: sharding_info((FakeNamedSharding(mesh, ("a", None)), shape), dtype="float32"),
        ),
    ]


def time_build(build, reps: int) -> tuple[dict, float]:
    """Build a summary ``reps`` times after one untimed call; return it and the median ms."""
    summary = build()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        summary = build()
        times.append((time.perf_counter() - t0) * 1e3)
    return summary, statistics.median(times)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass


class StaticServer:
    """Serves a directory on 127.0.0.1 from a thread; a context manager."""

    def __init__(self, directory: Path):
        handler = functools.partial(_QuietHandler, directory=str(directory))
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )

    def __enter__(self) -> StaticServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def render_all(summaries: list[tuple[int, str, dict]], reps: int, shots: Path | None) -> dict:
    """Render each summary ``reps`` times in chromium; return timings by (n, name)."""
    from playwright.sync_api import sync_playwright

    site = Path(tempfile.mkdtemp(prefix="jaxsys-bench-views-"))
    results: dict[tuple[int, str], dict] = {}
    try:
        for name in ("views.js", "views.css"):
            shutil.copy(STATIC / name, site / name)
        (site / "index.html").write_text(PAGE)
        with StaticServer(site) as server, sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS
            )
            try:
                page = browser.new_page(viewport={"width": 1200, "height": 900})
                page.set_default_timeout(PAGE_TIMEOUT_S * 1000)
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(server.url + "index.html", timeout=PAGE_TIMEOUT_S * 1000)
                page.wait_for_function("() => window.jxsReady === true")
                for n, name, summary in summaries:
                    kind = "mesh" if name == "mesh" else "sharding"
                    page.evaluate(RENDER_JS, {"kind": kind, "info": summary, "keep": False})
                    runs = [
                        page.evaluate(
                            RENDER_JS, {"kind": kind, "info": summary, "keep": i == reps - 1}
                        )
                        for i in range(reps)
                    ]
                    drawn = runs[-1]["drawn"]
                    if drawn["errors"] or errors:
                        raise BenchError(f"{name} at {n} devices: {drawn['errors'] or errors}")
                    if shots is not None:
                        shots.mkdir(parents=True, exist_ok=True)
                        page.screenshot(path=str(shots / f"{name}-{n}.png"), full_page=True)
                    results[(n, name)] = {
                        "sync": statistics.median(r["sync"] for r in runs),
                        "frame": statistics.median(r["frame"] for r in runs),
                        "drawn": drawn,
                    }
            finally:
                browser.close()
    finally:
        shutil.rmtree(site, ignore_errors=True)
    return results


def describe(drawn: dict) -> str:
    if drawn["canvases"]:
        return f"canvas x{drawn['canvases']}"
    if drawn["cells"]:
        return f"{drawn['cells']} cells"
    if drawn["blocks"]:
        return f"{drawn['blocks']} blocks"
    return "nothing"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 samples of each, not 7")
    ap.add_argument("--reps", type=int, default=None, help="timed builds and renders of each")
    ap.add_argument("--sizes", default="64,512,4096", help="device counts, comma-separated")
    ap.add_argument("--screenshot-dir", type=Path, default=None, help="save each view's PNG")
    args = ap.parse_args(argv)
    reps = args.reps or (3 if args.quick else 7)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    for n in sizes:
        if n < DEVICES_PER_PROCESS or n & (n - 1):
            raise SystemExit(f"--sizes: {n} is not a power of two >= {DEVICES_PER_PROCESS}")
    reason = available()
    if reason is not None:
        print(f"sharding_scale: cannot render: {reason}", file=sys.stderr)
        return 2

    print(
        f"sharding_scale: {', '.join(map(str, sizes))} fake devices, {DEVICES_PER_PROCESS} per "
        f"process; median of {reps} builds and renders; {os.cpu_count()} CPUs",
        flush=True,
    )
    built: list[tuple[int, str, dict]] = []
    rows: dict[tuple[int, str], dict] = {}
    meshes: dict[int, tuple[int, int]] = {}
    for n in sizes:
        meshes[n], cases = make_cases(n)
        for name, build in cases:
            summary, ms = time_build(build, reps)
            payload = len(json.dumps(summary))
            rows[(n, name)] = {"build": ms, "bytes": payload}
            built.append((n, name, summary))
    rendered = render_all(built, reps, args.screenshot_dir)

    header = (
        f"{'devices':>7} {'mesh':>7} {'view':>10} {'build ms':>9} {'payload B':>10} "
        f"{'B/device':>8} {'render ms':>9} {'sync ms':>8}  drawn as"
    )
    print()
    print(header)
    print("-" * len(header))
    for n, name, _ in built:
        r, d = rows[(n, name)], rendered[(n, name)]
        a, b = meshes[n]
        print(
            f"{n:>7} {f'{a}x{b}':>7} {name:>10} {r['build']:>9.1f} {r['bytes']:>10} "
            f"{r['bytes'] / n:>8.0f} {d['frame']:>9.1f} {d['sync']:>8.1f}  {describe(d['drawn'])}"
        )
    print()
    first, last = sizes[0], sizes[-1]
    growth = ", ".join(
        f"{name} {rows[(first, name)]['bytes'] / first:.0f} -> "
        f"{rows[(last, name)]['bytes'] / last:.0f}"
        for name in dict.fromkeys(name for _, name, _ in built)
    )
    print(f"payload bytes/device from {first} to {last} devices: {growth}")
    top = [(name, rows[(last, name)], rendered[(last, name)]) for n, name, _ in built if n == last]
    build_ms = max(r["build"] for _, r, _ in top)
    per_device = max(r["bytes"] / last for _, r, _ in top)
    render_ms = max(d["frame"] for _, _, d in top)
    print(
        f"at {last} devices the slowest build is {max(top, key=lambda t: t[1]['build'])[0]}, "
        f"the largest payload per device {max(top, key=lambda t: t[1]['bytes'])[0]}, the "
        f"slowest render {max(top, key=lambda t: t[2]['frame'])[0]}"
    )
    print()
    print(
        f"sharding_scale: {last} devices build {build_ms:.0f} ms, payload {per_device:.0f} "
        f"B/device, render {render_ms:.0f} ms (targets <= {BUILD_TARGET_MS:.0f} ms, O(n), "
        f"<= {RENDER_TARGET_MS:.0f} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
