"""The jaxsys sidebar and status bar in JupyterLab (headless chromium), as a new user meets
them: buttons that cannot act are disabled, the status bar names the state and what its
numbers count, Dump stacks says a process is idle, the log follows its newest line, the
process table fits or scrolls, and a kill asks first."""

from __future__ import annotations

import pytest

from ..browser import (
    Lab,
    available,
    launch,
    open_notebook,
    open_sidebar,
    run_cell,
    screenshot,
    wait_for,
)
from ..harness import write_notebook

REASON = available()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

STATUS = "#jaxsys-status"
SIDEBAR = "#jaxsys-sidebar"
CELLS = ["%jaxsys start --hosts 2 --devices-per-host 1"]
START = 0
BUTTONS = ["jaxsys-start", "jaxsys-stop", "jaxsys-restart-world", "jaxsys-stacks"]


def status_text(page, state: str, text: str, timeout: float = 60.0) -> str:
    page.wait_for_function(
        "([s, t]) => { const el = document.getElementById('jaxsys-status');"
        " return el && el.dataset.state === s && el.textContent.includes(t); }",
        arg=[state, text],
        timeout=timeout * 1000,
    )
    return page.locator(STATUS).inner_text()


def enabled(page) -> list[bool]:
    return page.evaluate(
        "(cls) => cls.map((c) => !document.querySelector(`#jaxsys-sidebar button.${c}`).disabled)",
        BUTTONS,
    )


def row_state(page, rank: int) -> str:
    return page.locator(f"{SIDEBAR} tr.jaxsys-process[data-rank='{rank}']").get_attribute(
        "data-state"
    )


ANSWERS = (
    "() => (document.querySelector('#jaxsys-sidebar .jaxsys-log').textContent"
    ".match(/stacks of/g) || []).length"
)


def dump_stacks(page, count: int) -> None:
    """Click Dump stacks ``count`` times, waiting for each answer in the log."""
    before = page.evaluate(ANSWERS)
    for n in range(1, count + 1):
        page.locator(f"{SIDEBAR} button.jaxsys-stacks").click()
        page.wait_for_function(f"(n) => ({ANSWERS})() >= n", arg=before + n, timeout=30_000)


def test_sidebar_for_a_new_user(tag, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    write_notebook(root / "side.ipynb", CELLS)
    with Lab(root, work_dir=tmp_path / "lab") as lab, launch(width=1400, height=900) as page:
        try:
            open_notebook(page, lab, "side.ipynb", timeout=120)
            assert status_text(page, "none", "no cluster") == "jaxsys: no cluster"
            open_sidebar(page)
            # With no cluster only Start can act.
            page.wait_for_function(
                "() => !document.querySelector('#jaxsys-sidebar button.jaxsys-start').disabled"
            )
            assert enabled(page) == [True, False, False, False]

            run_cell(page, START)
            text = status_text(page, "ok", "2/2", timeout=180)
            assert text.startswith("jaxsys: ready · 2/2 processes alive · 2 devices"), text
            assert "cache -" not in text
            assert enabled(page) == [False, True, True, True]

            # Dump stacks of idle processes says so; the log follows its newest line.
            dump_stacks(page, 8)
            log = page.locator(f"{SIDEBAR} .jaxsys-log")
            assert "p0 idle, waiting for a cell" in log.inner_text()
            follows = page.evaluate(
                "() => { const l = document.querySelector('#jaxsys-sidebar .jaxsys-log');"
                " return [l.scrollHeight > l.clientHeight,"
                " l.scrollTop + l.clientHeight >= l.scrollHeight - 2]; }"
            )
            assert follows == [True, True], follows

            # The process table fits the sidebar, or scrolls to its kill buttons.
            reach = page.evaluate(
                "() => { const s = document.querySelector('#jaxsys-sidebar .jaxsys-table-scroll');"
                " return s.scrollWidth <= s.clientWidth"
                " || getComputedStyle(s).overflowX === 'auto'; }"
            )
            assert reach

            # A kill asks first: cancelled, nothing happens; confirmed, the process dies.
            kill = page.locator(f"{SIDEBAR} tr.jaxsys-process[data-rank='1'] button.jaxsys-kill")
            kill.click()
            wait_for(page, ".jp-Dialog", 10)
            screenshot(page, "sidebar-kill-confirm.png")
            page.locator(".jp-Dialog button.jp-mod-reject").click()
            page.locator(".jp-Dialog").wait_for(state="detached", timeout=10_000)
            assert row_state(page, 1) == "alive"
            kill.click()
            page.locator(".jp-Dialog button.jp-mod-warn").click()
            text = status_text(page, "warning", "degraded", timeout=30)
            assert text.startswith("⚠ jaxsys: degraded · 1/2 processes alive"), text
            screenshot(page, "sidebar-degraded.png")

        except BaseException:
            screenshot(page, "sidebar-failure.png")
            raise
