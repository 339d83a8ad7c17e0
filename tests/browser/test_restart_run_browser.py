"""Restart JAX World and Run All Cells / Run up to Selected Cell, from JupyterLab's Kernel
menu and the jaxsys sidebar (headless chromium, a real kernel and a two-process cluster).

A name defined in a ``%%multihost`` cell is lost with the world; the two commands restart
the world through the command registry's ``restart`` and then run the cells again, as
Lab's own "Restart Kernel and Run ..." do for the kernel, so a later cell that uses the
name succeeds on the new processes. The cell that starts the cluster is skipped (the
restarted world is running with its options) and the sidebar says so.

Screenshots: ``tests/artifacts/restart-run-*.png``.
"""

from __future__ import annotations

import pytest

from ..browser import (
    Lab,
    assert_no_errors,
    available,
    launch,
    open_notebook,
    run_all,
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

SIDEBAR = "#jaxsys-sidebar"
CELLS = [
    "%jaxsys start --hosts 2 --devices-per-host 1",
    "%%multihost\nimport os\nbuilt = os.getpid()\nprint('built', built)",
    "%%multihost\nprint('uses', built)",
]
TO_SELECTED = "Restart JAX World and Run up to Selected Cell…"

#: Each cell's execution count and output text, read in one go.
CELL_VIEW = """() => [...window.jupyterapp.shell.currentWidget.content.widgets].map((c) => ({
  count: c.model.executionCount ?? null,
  text: c.node.querySelector('.jp-OutputArea')?.innerText ?? '',
}))"""


def cells(page) -> list[dict]:
    return page.evaluate(CELL_VIEW)


def ran_again(page, before: list[dict], index: int, timeout: float = 180.0) -> list[dict]:
    """Wait until cell ``index`` ran again and the notebook is idle; return the cells."""
    page.wait_for_function(
        f"([i, n]) => ({CELL_VIEW})()[i].count > n",
        arg=[index, before[index]["count"]],
        timeout=timeout * 1000,
    )
    wait_idle(page, timeout)
    return cells(page)


def accept(page) -> None:
    wait_for(page, ".jp-Dialog", 10)
    page.locator(".jp-Dialog button.jp-mod-warn").click()
    page.locator(".jp-Dialog").wait_for(state="detached", timeout=10_000)


def test_restart_world_and_run_rebuilds_the_names(tag, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    write_notebook(root / "rerun.ipynb", CELLS)
    with Lab(root, work_dir=tmp_path / "lab") as lab, launch(width=1600, height=1000) as page:
        try:
            open_notebook(page, lab, "rerun.ipynb", timeout=120)
            run_all(page)
            page.wait_for_function(
                f"() => ({CELL_VIEW})()[2].text.includes('uses')", timeout=240_000
            )
            wait_idle(page, 60)
            assert_no_errors(page)
            first = cells(page)

            # The Kernel menu, with cell 3 selected: cells 2 and 3 run on the new world.
            page.evaluate(
                "() => { window.jupyterapp.shell.currentWidget.content.activeCellIndex = 2; }"
            )
            page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
            page.locator(".lm-Menu-itemLabel", has_text=TO_SELECTED).click()
            accept(page)
            second = ran_again(page, first, 2)
            screenshot(page, "restart-run-to-selected.png")
            assert_no_errors(page)
            assert "uses" in second[2]["text"], second
            # New processes built the name again: their pids differ from the first world's.
            assert second[1]["text"] != first[1]["text"], (first, second)
            assert second[1]["count"] > first[1]["count"]
            # The start cell was skipped (the restarted world runs), and the sidebar says so.
            assert second[0]["count"] == first[0]["count"], second
            log = page.locator(f"{SIDEBAR} .jaxsys-log").inner_text()
            assert "JAX world restarted" in log, log
            assert "skipped cell 1 (%jaxsys start)" in log, log

            # The sidebar's button: Run All Cells.
            page.locator(f"{SIDEBAR} button.jaxsys-restart-world-run-all").click()
            accept(page)
            third = ran_again(page, second, 2)
            screenshot(page, "restart-run-all.png")
            assert_no_errors(page)
            assert "uses" in third[2]["text"] and third[1]["text"] != second[1]["text"], third
        except BaseException:
            screenshot(page, "restart-run-failure.png")
            print(lab.log_tail())
            raise
    assert lab.killed == [], f"outlived the server's shutdown: {lab.killed}"
    assert wait_no_processes(tag, timeout=30) == []
