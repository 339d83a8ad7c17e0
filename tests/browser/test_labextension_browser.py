"""The labextension in headless chromium: JupyterLab's status bar and the jaxsys sidebar
against a live 4-process cluster, and the quickstart in Notebook 7.

JupyterLab: the status item reads 4/4 after ``%jaxsys start``, turns to its warning state
after ``%jaxsys kill 2`` (the time is measured and printed), the sidebar's restart brings the
process back, its stop ends a hung cell, and a kernel restart re-attaches the comm.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxsys_kernel import contract

from ..browser import (
    ARTIFACTS,
    OUTPUT,
    Lab,
    available,
    launch,
    open_notebook,
    open_sidebar,
    run_cell,
    screenshot,
    wait_for,
    wait_idle,
)
from ..harness import tagged_processes, wait_no_processes, write_notebook

REASON = available()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

QUICKSTART = Path(__file__).parents[2] / "notebooks" / "00-quickstart.ipynb"
STATUS = "#jaxsys-status"
SIDEBAR = "#jaxsys-sidebar"
# JAX's heartbeat timeout of a cluster started by %jaxsys start (Cluster's default).
HEARTBEAT_S = 10.0

MAGIC_BODY = "import jax\nx = 'text'  # note\nprint(len(x), jax.process_index())"
CELLS = [
    # Two cells that are only looked at: the same code with and without a magic line.
    f"%%multihost --procs 0,1\n{MAGIC_BODY}",
    MAGIC_BODY,
    "%jaxsys start --hosts 4 --devices-per-host 1",
    "%jaxsys kill 2",
    "%%multihost\nimport time\ntime.sleep(300)",
]
MAGIC, PLAIN, START, KILL, HUNG = range(5)

# The highlighted tokens of every line of a cell's editor: [[text, class], ...] per line.
TOKENS = """(i) => {
  const cell = document.querySelectorAll('.jp-NotebookPanel .jp-Cell')[i];
  return [...cell.querySelectorAll('.cm-content .cm-line')].map((line) =>
    [...line.querySelectorAll('span')].map((s) => [s.textContent, s.className]));
}"""

# Runs cell i and records, in the page's clock, when the status item first shows `state`.
RUN_AND_WATCH = """([i, state]) => {
  const el = document.getElementById('jaxsys-status');
  window.__jaxsysSeen = null;
  const t0 = performance.now();
  const check = () => {
    if (el.dataset.state === state && window.__jaxsysSeen === null) {
      window.__jaxsysSeen = (performance.now() - t0) / 1000;
    }
  };
  new MutationObserver(check).observe(el, {attributes: true, childList: true,
                                           characterData: true, subtree: true});
  const nb = window.jupyterapp.shell.currentWidget.content;
  nb.activeCellIndex = i;
  void window.jupyterapp.commands.execute('notebook:run-cell');
}"""


def _status(page) -> tuple[str, str]:
    loc = page.locator(STATUS)
    return loc.get_attribute("data-state"), loc.inner_text()


def _wait_status(page, state: str, text: str = "", timeout: float = 30.0) -> str:
    page.wait_for_function(
        "([s, t]) => { const el = document.getElementById('jaxsys-status');"
        " return el && el.dataset.state === s && el.textContent.includes(t); }",
        arg=[state, text],
        timeout=timeout * 1000,
    )
    return page.locator(STATUS).inner_text()


def _kernel_pid(page) -> str | None:
    return page.locator(SIDEBAR).get_attribute("data-kernel-pid")


def _rows(page) -> dict[str, str]:
    return page.evaluate(
        "() => Object.fromEntries([...document.querySelectorAll("
        "'#jaxsys-sidebar tr.jaxsys-process')].map((r) => [r.dataset.rank, r.dataset.state]))"
    )


# The same, for cell i of the notebook in front (other notebooks' cells stay in the DOM).
CURRENT_TOKENS = """(i) => {
  const cell = window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-Cell')[i];
  return [...cell.querySelectorAll('.cm-content .cm-line')].map((line) =>
    [...line.querySelectorAll('span')].map((s) => [s.textContent, s.className]));
}"""


def _check_other_kernels_keep_their_language(page, lab, root) -> None:
    """A notebook of another IPython kernel keeps JupyterLab's own editor language."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(f"%%multihost --procs 0,1\n{MAGIC_BODY}")]
    nbformat.write(nb, root / "plain.ipynb")
    open_notebook(page, lab, "plain.ipynb", timeout=60)
    page.wait_for_function(
        f"() => ({CURRENT_TOKENS})(0).length === 4 && "
        "window.jupyterapp.shell.currentWidget.context.path === 'plain.ipynb'",
        timeout=30_000,
    )
    tokens = page.evaluate(CURRENT_TOKENS, 0)
    assert not any("cm-jaxsys-magic" in cls for line in tokens for _, cls in line), tokens


def _check_highlighting(page) -> None:
    magic, plain = page.evaluate(TOKENS, MAGIC), page.evaluate(TOKENS, PLAIN)
    assert len(magic) == len(plain) + 1, (magic, plain)
    # The magic line: its name marked, nothing of it parsed as Python.
    assert magic[0] == [["%%multihost", "cm-jaxsys-magic"]], magic[0]
    # The lines below it are highlighted exactly as the same code without the magic line.
    assert magic[1:] == plain, (magic[1:], plain)
    assert any(cls for line in plain for _text, cls in line), plain


def _check_commands(page) -> None:
    ids = [
        "jaxsys:start-cluster",
        "jaxsys:stop-cluster",
        "jaxsys:restart-world",
        "jaxsys:dump-stacks",
        "jaxsys:open-sidebar",
    ]
    found = page.evaluate("(ids) => ids.map((i) => window.jupyterapp.commands.hasCommand(i))", ids)
    assert found == [True] * 5, dict(zip(ids, found, strict=True))
    page.locator("li.lm-MenuBar-item", has_text="Kernel").click()
    menu = page.locator(".lm-Menu-content").last
    labels = menu.locator(".lm-Menu-itemLabel").all_inner_texts()
    page.keyboard.press("Escape")
    assert "jaxsys: Stop the Cluster" in labels and "jaxsys: Open the Cluster Sidebar" in labels
    enabled = page.evaluate("(ids) => ids.map((i) => window.jupyterapp.commands.isEnabled(i))", ids)
    # A cluster runs: it can be stopped, restarted and asked for stacks, not started.
    assert enabled == [False, True, True, True, True], dict(zip(ids, enabled, strict=True))


def _kill_to_warning(page) -> float:
    page.evaluate(RUN_AND_WATCH, [KILL, "warning"])
    text = _wait_status(page, "warning", "3/4", timeout=HEARTBEAT_S + 5)
    seen = page.evaluate("() => window.__jaxsysSeen")
    assert text.startswith("⚠ jaxsys: degraded · 3/4 processes alive · 3 devices"), text
    assert seen is not None and seen < HEARTBEAT_S + 1, seen
    page.wait_for_function(
        "() => document.querySelector('#jaxsys-sidebar tr.jaxsys-process[data-rank=\"2\"]')"
        "?.dataset.state === 'dead'",
        timeout=5000,
    )
    return seen


def _external_kill(page, tag: str, rank: int) -> float:
    """SIGKILL process ``rank`` behind the kernel's back; seconds until the warning shows."""
    victims = [
        p for p in tagged_processes(tag) if p.environ().get(contract.PROCESS_ID) == str(rank)
    ]
    assert victims, f"no process {rank} found"
    t0 = time.monotonic()
    for p in victims:
        p.kill()
    text = _wait_status(page, "warning", "3/4", timeout=HEARTBEAT_S + 5)
    took = time.monotonic() - t0
    assert text.startswith("⚠ jaxsys: degraded · 3/4 processes alive"), text
    assert _rows(page)[str(rank)] == "dead"
    assert took < HEARTBEAT_S + 1, took
    return took


def _stop_hung_cell(page) -> float:
    run_cell_async(page, HUNG)
    page.wait_for_function(
        "() => document.querySelector('#jaxsys-sidebar .jaxsys-summary')"
        "?.textContent.includes('a cell is running')",
        timeout=30_000,
    )
    # The commands reach the kernel while the cell blocks it.
    page.evaluate("() => window.jupyterapp.commands.execute('jaxsys:dump-stacks')")
    wait_for(page, f"{SIDEBAR} .jaxsys-log:has-text('stacks of p0-3')", 30)
    t0 = time.monotonic()
    page.locator(f"{SIDEBAR} button.jaxsys-stop").click()
    _wait_status(page, "none", "no cluster", timeout=60)
    wait_idle(page, 30)
    took = time.monotonic() - t0
    hung = page.locator(".jp-NotebookPanel .jp-Cell").nth(HUNG)
    # The cell was interrupted (its processes with it) before the cluster went away.
    out = "\n".join(hung.locator(OUTPUT).all_inner_texts())
    assert "interrupted processes p0-3" in out, out
    return took


def run_cell_async(page, index: int) -> None:
    """Queue cell ``index`` without waiting for it."""
    page.evaluate(
        "(i) => { const nb = window.jupyterapp.shell.currentWidget.content;"
        " nb.activeCellIndex = i;"
        " void window.jupyterapp.commands.execute('notebook:run-cell'); }",
        index,
    )


def _restart_kernel(page, old_pid: str) -> float:
    t0 = time.monotonic()
    page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()"
    )
    page.wait_for_function(
        "(old) => { const pid = document.getElementById('jaxsys-sidebar').dataset.kernelPid;"
        " return pid && pid !== old; }",
        arg=old_pid,
        timeout=60_000,
    )
    _wait_status(page, "none", "no cluster", timeout=10)
    return time.monotonic() - t0


def test_status_bar_and_sidebar_in_lab(tag, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    write_notebook(root / "lab.ipynb", CELLS)
    times: dict[str, float] = {}
    with Lab(root, work_dir=tmp_path / "lab") as lab:
        with launch(width=1400, height=1000) as page:
            try:
                open_notebook(page, lab, "lab.ipynb", timeout=120)
                # The comm opened with the kernel: it says there is no cluster yet.
                assert _wait_status(page, "none", "no cluster") == "jaxsys: no cluster"
                pid = _kernel_pid(page)
                assert pid and pid.isdigit()
                _check_highlighting(page)

                t0 = time.monotonic()
                run_cell(page, START)
                text = _wait_status(page, "ok", "4/4", timeout=180)
                times["start -> 4/4"] = time.monotonic() - t0
                # Every number says what it counts; no bare "cache -" before any compile.
                assert text.startswith("jaxsys: ready · 4/4 processes alive · 4 devices"), text
                assert "cache -" not in text, text
                _check_commands(page)

                open_sidebar(page, f"{SIDEBAR} tr.jaxsys-process")
                assert _rows(page) == dict.fromkeys("0123", "alive")
                screenshot(page, "labextension-4of4.png")

                times["kill -> warning"] = _kill_to_warning(page)
                screenshot(page, "labextension-warning.png")

                t0 = time.monotonic()
                page.locator(
                    f"{SIDEBAR} tr.jaxsys-process[data-rank='2'] button.jaxsys-restart"
                ).click()
                _wait_status(page, "ok", "4/4", timeout=120)
                times["sidebar restart p2 -> 4/4"] = time.monotonic() - t0
                assert _rows(page) == dict.fromkeys("0123", "alive")
                wait_for(page, f"{SIDEBAR} .jaxsys-message:has-text('p2 rejoined')", 10)

                times["external SIGKILL of p3 -> warning"] = _external_kill(page, tag, 3)
                page.locator(
                    f"{SIDEBAR} tr.jaxsys-process[data-rank='3'] button.jaxsys-restart"
                ).click()
                _wait_status(page, "ok", "4/4", timeout=120)

                times["sidebar stop -> hung cell ended"] = _stop_hung_cell(page)
                screenshot(page, "labextension-stopped.png")

                times["kernel restart -> comm re-attached"] = _restart_kernel(page, pid)
                screenshot(page, "labextension-restarted.png")
                _check_other_kernels_keep_their_language(page, lab, root)
            except BaseException:
                screenshot(page, "labextension-failure.png")
                print(lab.log_tail())
                raise
    assert lab.killed == [], f"outlived the server's shutdown: {lab.killed}"
    assert wait_no_processes(tag, timeout=15) == []
    for what, took in times.items():
        print(f"labextension: {what}: {took:.2f} s")
    assert times["kill -> warning"] < HEARTBEAT_S + 1


def _quickstart_with_dashboard(path: Path) -> int:
    """Copy the quickstart with a dashboard cell before its last `%jaxsys stop`; returns how
    many cells are meant to raise."""
    nb = json.loads(QUICKSTART.read_text())
    stop = max(
        i for i, c in enumerate(nb["cells"]) if "".join(c["source"]).strip() == "%jaxsys stop"
    )
    dashboard = {
        "cell_type": "code",
        "execution_count": None,
        "id": "jaxsys-dashboard",
        "metadata": {},
        "outputs": [],
        "source": ["%jaxsys dashboard"],
    }
    nb["cells"].insert(stop, dashboard)
    path.write_text(json.dumps(nb))
    return sum("raises-exception" in c["metadata"].get("tags", []) for c in nb["cells"])


ERROR_OUTPUTS_IN_MODEL = """() => {
  const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
  let n = 0;
  for (let i = 0; i < cells.length; i++) {
    const cell = cells.get(i);
    if (cell.type !== 'code') continue;
    for (let j = 0; j < cell.outputs.length; j++) {
      if (cell.outputs.get(j).type === 'error') n++;
    }
  }
  return n;
}"""


# The mime types of the outputs of the quickstart's mesh cell (the one ending in `mesh`).
MESH_OUTPUT_IN_MODEL = """() => {
  const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
  for (let i = 0; i < cells.length; i++) {
    const cell = cells.get(i);
    if (cell.type !== 'code' || !cell.sharedModel.getSource().trimEnd().endsWith('\\nmesh')) {
      continue;
    }
    const kinds = [];
    for (let j = 0; j < cell.outputs.length; j++) {
      kinds.push(...Object.keys(cell.outputs.get(j).data));
    }
    return kinds;
  }
  return null;
}"""


def test_quickstart_in_notebook7(tag, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    raising = _quickstart_with_dashboard(root / "quickstart.ipynb")
    # Notebook 7's pages come from the notebook server extension; it reads its own option
    # for window.jupyterapp.
    extra = ["--JupyterNotebookApp.expose_app_in_browser=True"]
    t0 = time.monotonic()
    with Lab(root, work_dir=tmp_path / "lab", extra_args=extra) as lab:
        with launch(width=1400, height=1000) as page:
            try:
                open_notebook_7(page, lab, "quickstart.ipynb")
                # Notebook 7 has no status bar: the item sits in the notebook's toolbar.
                assert page.locator(f".jp-NotebookPanel-toolbar {STATUS}").count() == 1
                _wait_status(page, "none", "no cluster")
                page.evaluate(
                    "() => { const el = document.getElementById('jaxsys-status');"
                    " window.__jaxsysTexts = [];"
                    " new MutationObserver(() => window.__jaxsysTexts.push(el.textContent))"
                    ".observe(el, {childList: true, characterData: true, subtree: true}); }"
                )
                page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
                # The dashboard comes last, on the quickstart's second cluster (2 processes).
                rows = wait_for(page, ".jxs-live .jxs-live-row >> nth=1", 300)
                assert rows.is_visible()
                wait_for(page, f"{OUTPUT}:has-text('as expected: True')", 60)
                _wait_status(page, "none", "no cluster", timeout=120)
                wait_idle(page, 60)
                # A click on the item opens the sidebar in Notebook 7's left area.
                open_sidebar(page, f"{SIDEBAR} .jaxsys-summary:has-text('no cluster')")
                screenshot(page, "notebook7-quickstart.png")
                texts = page.evaluate("() => window.__jaxsysTexts")
                # The first cluster's 4 processes x 2 devices, in words (labextension/src/model.ts).
                ready = "jaxsys: ready · 4/4 processes alive · 8 devices"
                assert any(t.startswith(ready) for t in texts), texts
                # Counted in the notebook's model: cells scrolled out of view may not be drawn.
                errors = page.evaluate(ERROR_OUTPUTS_IN_MODEL)
                assert errors == raising, errors
                # The mesh cell shows its picture: the view, and the PNG for saved copies.
                kinds = page.evaluate(MESH_OUTPUT_IN_MODEL)
                assert kinds and "image/png" in kinds, kinds
                assert "application/vnd.jupyter.widget-view+json" in kinds, kinds
                # The dashboard is on the second cluster: the first one's mesh is not shown.
                dash = f"{OUTPUT}:has(.jxs-live) .jxs-empty:has-text('No mesh yet.')"
                assert page.locator(dash).count() == 1
            except BaseException:
                screenshot(page, "notebook7-failure.png")
                print(lab.log_tail())
                raise
    assert lab.killed == [], f"outlived the server's shutdown: {lab.killed}"
    assert wait_no_processes(tag, timeout=15) == []
    print(f"Notebook 7 quickstart with the dashboard: {time.monotonic() - t0:.1f} s")


def open_notebook_7(page, lab: Lab, name: str, timeout: float = 120.0) -> None:
    """Open ``name`` in Notebook 7 and wait for its kernel to be idle."""
    page.goto(lab.page_url(f"notebooks/{name}"), timeout=timeout * 1000)
    page.wait_for_function(
        "() => window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel"
        "?.status === 'idle'",
        timeout=timeout * 1000,
    )
    wait_for(page, ".jp-NotebookPanel .jp-Cell", timeout)


def test_jupyterlab_browser_check_passes(tmp_path):
    # Private Jupyter state, as the Lab helper keeps it (no user settings or extensions).
    env = Lab(tmp_path / "root", work_dir=tmp_path / "state")._env()
    env["JLAB_BROWSER_CHECK_OUTPUT"] = str(ARTIFACTS / "browser-check")
    cmd = [
        sys.executable,
        str(Path(__file__).parents[1] / "lab_browser_check.py"),
        "--allow-root",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    ]
    out = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=240, start_new_session=True
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert "browser check: JupyterLab started without errors" in log, log[-4000:]
