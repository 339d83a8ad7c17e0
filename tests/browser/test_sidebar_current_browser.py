"""The jaxsys sidebar follows the world, whoever changes it (headless chromium, a real kernel
and a cluster with the kernel's defaults, started by the first ``%%multihost`` cell).

- The last-action line never describes a world that is gone: after the sidebar's Stop,
  a cell that starts a cluster again turns it from ``cluster stopped`` to the new cluster.
- The log shows what cells did with ``%jaxsys`` (kill, restart of one process, restart of
  the world) beside the sidebar's own clicks, and a death as it happens.
- A row's ``↻N`` counts restarts in the current world: a world restart resets it.
- A cell ended by the sidebar's Stop says so under its ``KeyboardInterrupt``.

Screenshot: ``tests/artifacts/sidebar-current.png``.
"""

from __future__ import annotations

import pytest

from ..browser import (
    Lab,
    available,
    describe_notebook,
    launch,
    open_notebook,
    open_sidebar,
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

STATUS = "#jaxsys-status"
SIDEBAR = "#jaxsys-sidebar"
STDERR = '.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]'
CELLS = [
    "%%multihost\nprint('auto-started')",
    "%jaxsys kill 1",
    "%jaxsys restart 1",
    "%jaxsys restart",
    "%%multihost\nimport time\ntime.sleep(600)",
]
AUTO, KILL, RESTART_ONE, RESTART_WORLD, SLEEP = range(5)


def text(page, cls: str) -> str:
    return page.locator(f"{SIDEBAR} .{cls}").inner_text()


def log_has(page, fragment: str, timeout: float = 120.0) -> str:
    """Wait until the sidebar's log holds ``fragment``; return the log."""
    page.wait_for_function(
        "(f) => document.querySelector('#jaxsys-sidebar .jaxsys-log')?.textContent.includes(f)",
        arg=fragment,
        timeout=timeout * 1000,
    )
    return text(page, "jaxsys-log")


def first_cell(page, rank: int) -> str:
    return page.locator(f"{SIDEBAR} tr.jaxsys-process[data-rank='{rank}'] td").nth(0).inner_text()


def wait_row(page, rank: int, expected: str, timeout: float = 60.0) -> None:
    page.wait_for_function(
        "([r, t]) => document.querySelector("
        "`#jaxsys-sidebar tr.jaxsys-process[data-rank='${r}'] td`)?.textContent === t",
        arg=[rank, expected],
        timeout=timeout * 1000,
    )


def test_the_sidebar_follows_every_surface(tag, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    write_notebook(root / "current.ipynb", CELLS)
    with Lab(root, work_dir=tmp_path / "lab") as lab, launch(width=1600, height=1000) as page:
        try:
            open_notebook(page, lab, "current.ipynb", timeout=120)
            open_sidebar(page)
            run_cell(page, AUTO)
            log_has(page, "cluster ready: ", 180)
            wait_idle(page, 60)

            # The sidebar's Stop, then a cell starts a cluster again: the line follows.
            page.locator(f"{SIDEBAR} button.jaxsys-stop").click()
            page.wait_for_function(
                "() => document.querySelector('#jaxsys-sidebar .jaxsys-message')"
                "?.textContent.startsWith('cluster stopped')",
                timeout=60_000,
            )
            before = text(page, "jaxsys-log").count("cluster ready: ")
            run_cell(page, AUTO)
            page.wait_for_function(
                "(n) => (document.querySelector('#jaxsys-sidebar .jaxsys-log').textContent"
                ".match(/cluster ready: /g) || []).length > n",
                arg=before,
                timeout=180_000,
            )
            wait_idle(page, 60)
            message = text(page, "jaxsys-message")
            assert "cluster stopped" not in message, message
            assert message.startswith("cluster ready"), message

            # Cells kill and restart p1: the log says so, with the surface that did it.
            run_cell(page, KILL)
            log = log_has(page, "%jaxsys kill p1: p1 killed")
            wait_idle(page, 60)
            assert "p1 died" in log or "p1 died" in log_has(page, "p1 died", 30), log
            run_cell(page, RESTART_ONE)
            log_has(page, "%jaxsys restart p1: p1 rejoined", 120)
            wait_row(page, 1, "p1 ↻1")
            wait_idle(page, 60)

            # A world restart from a cell: said in the log, and the counter starts again.
            run_cell(page, RESTART_WORLD)
            log = log_has(page, "%jaxsys restart: JAX world restarted", 120)
            wait_row(page, 1, "p1")
            wait_idle(page, 60)
            screenshot(page, "sidebar-current.png")
            assert first_cell(page, 0) == "p0"
            assert "JAX world restarting" in log, log

            # The sidebar's Stop while a cell runs: the cell says who ended it.
            # Queued without waiting for its end (run_cell's command resolves only then).
            page.evaluate(
                "(i) => { const w = window.jupyterapp.shell.currentWidget;"
                " w.content.activeCellIndex = i;"
                " void window.jupyterapp.commands.execute('notebook:run-cell'); }",
                SLEEP,
            )
            page.wait_for_function(
                "() => document.querySelector('#jaxsys-sidebar .jaxsys-summary')"
                "?.textContent.includes('a cell is running')",
                timeout=60_000,
            )
            page.locator(f"{SIDEBAR} button.jaxsys-stop").click(timeout=20_000)
            said = wait_for(page, f"{STDERR}:has-text('interrupted from the sidebar')", 90)
            assert "its Stop stops the cluster" in said.inner_text()
            log = log_has(page, "stop-cluster: cluster stopped", 60)
            wait_idle(page, 60)
            # The processes the Stop ended are not reported as deaths.
            after = log.split("%jaxsys restart: JAX world restarted")[-1]
            assert " died" not in after, after
            screenshot(page, "sidebar-stop-says-why.png")
        except BaseException:
            screenshot(page, "sidebar-current-failure.png")
            print(describe_notebook(page))
            print(lab.log_tail())
            raise
    assert lab.killed == [], f"outlived the server's shutdown: {lab.killed}"
    assert wait_no_processes(tag, timeout=30) == []
