"""JupyterLab in headless chromium shows a mesh, a process-spanning sharding and a live
dashboard that keeps updating while a ``%%multihost`` cell blocks the kernel."""

from __future__ import annotations

import re
import time

import pytest

from ..browser import (
    OUTPUT,
    Lab,
    assert_no_errors,
    available,
    launch,
    open_notebook,
    run_cell,
    screenshot,
    wait_for,
    wait_idle,
)
from ..harness import wait_no_processes, write_notebook

REASON = available()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

SLEEP_S = 4.0

CELLS = [
    "%jaxsys start --hosts 2 --devices-per-host 2",
    # The mesh's device ids in mesh order (row-major), printed for the DOM check.
    "%%multihost\n"
    "import jax\n"
    "mesh = jax.make_mesh((2, 2), ('x', 'y'))\n"
    "print('mesh ids', [int(d.id) for d in mesh.devices.flat])\n"
    "mesh",
    # Each process supplies its own rows; the global array spans both processes.
    "%%multihost\n"
    "import numpy as np\n"
    "from jax.sharding import NamedSharding, PartitionSpec as P\n"
    "rows = np.full((4, 4), jax.process_index(), dtype=np.float32)\n"
    "arr = jax.make_array_from_process_local_data(NamedSharding(mesh, P('x', None)), rows)\n"
    "print('global', arr.shape, 'processes', sorted({d.process_index for d in arr.devices()}))\n"
    "arr",
    "%jaxsys dashboard",
    f"%%multihost\nimport time\ntime.sleep({SLEEP_S})\nprint('slept')",
    "%jaxsys transfer-guard log --reset-counts",
    # Each add moves the NumPy array and the Python scalar to the device: 2 logged per process.
    "%%multihost\nimport jax.numpy as jnp\nprint('added', jnp.add(np.ones(3, np.float32), 1.0))",
]
MESH, SHARDING, DASHBOARD, SLEEP, GUARD, ADD = 1, 2, 3, 4, 5, 6

# The state of each row of the dashboard's live view, read from the DOM.
LIVE_ROWS = """(cell) => {
  const c = document.querySelectorAll('.jp-NotebookPanel .jp-Cell')[cell];
  return [...c.querySelectorAll('.jxs-live .jxs-live-row')].map((r) => ({
    name: r.querySelector('.jxs-live-name')?.textContent,
    state: r.querySelector('.jxs-state')?.textContent,
    info: r.querySelector('.jxs-muted')?.textContent,
  }));
}"""

# Whether a cell's prompt shows it queued or running ("[*]").
RUNNING = """(cell) => {
  const c = document.querySelectorAll('.jp-NotebookPanel .jp-Cell')[cell];
  return (c.querySelector('.jp-InputArea-prompt')?.textContent || '').includes('*');
}"""


def _start_cell(page, index: int) -> None:
    """Run cell ``index`` without waiting for it (``browser.run_cell`` waits until it ends)."""
    page.evaluate(
        "(i) => { const nb = window.jupyterapp.shell.currentWidget.content;"
        " nb.activeCellIndex = i;"
        " void window.jupyterapp.commands.execute('notebook:run-cell'); }",
        index,
    )


def _cell(page, index: int):
    return page.locator(".jp-NotebookPanel .jp-Cell").nth(index)


def _mesh_ids(page) -> list[int]:
    text = _cell(page, MESH).locator(OUTPUT).all_inner_texts()
    m = re.search(r"mesh ids \[([\d, ]+)\]", "\n".join(text))
    assert m, f"the mesh cell printed no device ids: {text}"
    return [int(v) for v in m.group(1).split(",")]


def _check_mesh(page) -> None:
    ids = _mesh_ids(page)
    assert len(ids) == 4, ids
    cells = _cell(page, MESH).locator(".jxs-mesh .jxs-cell")
    cells.first.wait_for(state="visible", timeout=30_000)
    assert cells.count() == 4, cells.all_inner_texts()
    labels = [int(b) for b in cells.locator("b").all_inner_texts()]
    procs = cells.locator("span").all_inner_texts()
    # Drawn in mesh order, each cell labelled with its device id and process.
    assert labels == ids, (labels, ids)
    assert sorted(procs) == ["p0", "p0", "p1", "p1"], procs
    title = _cell(page, MESH).locator(".jxs-mesh .jxs-title").inner_text()
    assert "x=2" in title and "y=2" in title and "4 devices on 2 processes" in title, title


def _check_sharding(page) -> None:
    out = "\n".join(_cell(page, SHARDING).locator(OUTPUT).all_inner_texts())
    assert "processes [0, 1]" in out, out
    view = _cell(page, SHARDING).locator(".jxs-sharding")
    blocks = view.locator(".jxs-block")
    blocks.first.wait_for(state="visible", timeout=30_000)
    assert blocks.count() == 2, view.inner_text()
    # Rows split over x (one process per half), each half replicated over y's two devices.
    block_procs = sorted(blocks.locator("small").all_inner_texts())
    assert block_procs == ["p0", "p1"], block_procs
    devices = blocks.locator("span").all_inner_texts()
    assert all(d.startswith("d") for d in devices), devices
    badges = blocks.locator(".jxs-badge").all_inner_texts()
    assert badges == ["×2", "×2"], badges
    legend = view.locator(".jxs-legend .jxs-chip").all_inner_texts()
    assert [t.strip() for t in legend] == ["p0", "p1"], legend
    title = view.locator(".jxs-title").inner_text()
    assert "float32[8, 4]" in title and "P('x', None)" in title, title


def _watch_busy(page, timeout: float) -> dict:
    """Poll the dashboard until both processes show busy while the sleep cell runs."""
    deadline = time.monotonic() + timeout
    seen: list = []
    while time.monotonic() < deadline:
        rows = page.evaluate(LIVE_ROWS, DASHBOARD)
        running = page.evaluate(RUNNING, SLEEP)
        seen.append((round(time.monotonic() - deadline + timeout, 2), running, rows))
        if running and len(rows) == 2 and all("busy" in (r["info"] or "") for r in rows):
            return {"rows": rows, "history": seen}
        page.wait_for_timeout(100)
    changes = [s for i, s in enumerate(seen) if i == 0 or s[1:] != seen[i - 1][1:]]
    cell = _cell(page, SLEEP)
    raise AssertionError(
        f"the dashboard never showed both processes busy: {changes}; sleep cell prompt "
        f"{cell.locator('.jp-InputArea-prompt').inner_text()!r}, output "
        f"{cell.locator(OUTPUT).all_inner_texts()}"
    )


def test_dashboard_mesh_and_sharding_in_lab(tag, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    write_notebook(root / "dashboard.ipynb", CELLS)
    t0 = time.monotonic()
    with Lab(root, work_dir=tmp_path / "lab") as lab:
        assert "jaxsys" in lab.kernelspecs(), lab.log_tail()
        with launch(width=1400, height=1200) as page:
            try:
                open_notebook(page, lab, "dashboard.ipynb", timeout=120)
                # Everything but the sleep, which runs once the views have been checked.
                # (run_cell returns when the cell has finished.)
                for i in range(SLEEP):
                    run_cell(page, i)
                wait_for(page, f"{OUTPUT}:has-text('mesh ids')", 30)
                wait_idle(page, 60)
                assert_no_errors(page)
                _check_mesh(page)
                _check_sharding(page)

                # The dashboard comes up with both processes alive and idle ...
                wait_for(page, ".jxs-live .jxs-live-row", 60)
                rows = page.evaluate(LIVE_ROWS, DASHBOARD)
                assert [r["name"] for r in rows] == ["p0", "p1"], rows
                assert [r["state"] for r in rows] == ["alive", "alive"], rows
                page.wait_for_function(
                    f"() => ({LIVE_ROWS})({DASHBOARD}).every((r) => !(r.info || '').includes('busy'))",
                    timeout=10_000,
                )
                dash = _cell(page, DASHBOARD)
                assert dash.locator(".jxs-mesh .jxs-cell").count() == 4
                assert dash.locator(".jxs-sharding .jxs-block").count() == 2
                assert dash.locator(".jxs-cache .jxs-table").count() == 1

                # ... and shows them busy while the sleep cell blocks the kernel.
                dash.scroll_into_view_if_needed()
                _start_cell(page, SLEEP)
                busy = _watch_busy(page, timeout=SLEEP_S + 30)
                assert [r["state"] for r in busy["rows"]] == ["alive", "alive"], busy["rows"]
                screenshot(page, "dashboard.png")

                wait_idle(page, 60)
                wait_for(page, f"{OUTPUT}:has-text('slept')", 10)
                # Once the cell is done, the next update clears the busy marks.
                page.wait_for_function(
                    f"() => ({LIVE_ROWS})({DASHBOARD}).every((r) => !(r.info || '').includes('busy'))",
                    timeout=10_000,
                )
                assert_no_errors(page)
                assert page.locator(".jxs-error").count() == 0

                # Transfers the guard logs appear on each process's row.
                run_cell(page, GUARD)
                run_cell(page, ADD)
                wait_for(page, f"{OUTPUT}:has-text('added')", 30)
                page.wait_for_function(
                    "(cell) => { const c = document.querySelectorAll('.jp-NotebookPanel .jp-Cell')"
                    "[cell]; const t = [...c.querySelectorAll('.jxs-live-row .jxs-transfers')]"
                    ".map((e) => e.textContent); return t.length === 2 && "
                    "t.every((x) => x.includes('2 h2d · 0 d2h · 0 d2d')); }",
                    arg=DASHBOARD,
                    timeout=15_000,
                )
            except BaseException:
                screenshot(page, "dashboard-failure.png")
                print(lab.log_tail())
                raise
        assert len(lab.kernels()) == 1
    assert lab.killed == [], f"outlived the server's shutdown: {lab.killed}"
    assert wait_no_processes(tag, timeout=15) == []
    print(f"browser dashboard test: {time.monotonic() - t0:.1f} s")
