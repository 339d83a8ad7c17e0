"""JupyterLab in headless chromium: the dashboard's straggler view names the process a
``%jaxsys slow`` delay holds back, with its category, from a cell of collective steps,
and stops naming it once the delay is off."""

from __future__ import annotations

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
from ..live.test_stragglers_live import SETUP, START, STEPS

REASON = available()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

CELLS = [
    START,
    SETUP + "print('compiled', float(step(x)))\n",
    "%jaxsys dashboard",
    "%jaxsys where on",
    "%jaxsys slow 1 --ms 200",
    STEPS,
    "%jaxsys slow 1 --off",
    STEPS,
]
DASHBOARD, WHERE_ON, SLOW, DELAYED, OFF, UNDELAYED = 2, 3, 4, 5, 6, 7

# What the dashboard's straggler view shows, read from the DOM.
VIEW = """(cell) => {
  const c = document.querySelectorAll('.jp-NotebookPanel .jp-Cell')[cell];
  const v = c.querySelector('.jxs-stragglers');
  if (!v) return null;
  return {
    verdict: v.querySelector('.jxs-verdict')?.textContent || '',
    empty: v.querySelector('.jxs-empty')?.textContent || '',
    steps: [...v.querySelectorAll('.jxs-step')].map((r) => ({
      last: r.querySelector('.jxs-step-last')?.textContent,
      category: r.querySelector('.jxs-step-category')?.textContent,
    })),
    bars: [...v.querySelectorAll('.jxs-strag-row')].map((r) => ({
      name: r.querySelector('.jxs-strag-name')?.textContent,
      parts: [...r.querySelectorAll('.jxs-seg')].map((s) => s.getAttribute('title')),
    })),
  };
}"""


def _view_until(page, check, what: str, timeout: float = 30.0) -> dict:
    """The view's state once ``check`` holds, polled with a deadline."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = page.evaluate(VIEW, DASHBOARD)
        if seen and check(seen):
            return seen
        page.wait_for_timeout(200)
    raise AssertionError(f"the straggler view never showed {what}: {seen}")


def test_the_dashboard_names_the_delayed_process_and_its_category(tag, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    write_notebook(root / "stragglers.ipynb", CELLS)
    t0 = time.monotonic()
    with Lab(root, work_dir=tmp_path / "lab") as lab:
        with launch(width=1400, height=1400) as page:
            try:
                open_notebook(page, lab, "stragglers.ipynb", timeout=120)
                for i in range(WHERE_ON):
                    run_cell(page, i)
                wait_for(page, f"{OUTPUT}:has-text('compiled')", 60)
                wait_idle(page, 60)
                assert_no_errors(page)
                _view_until(page, lambda v: "%jaxsys where on" in v["empty"], "how to record")

                run_cell(page, WHERE_ON)
                _view_until(page, lambda v: v["empty"].startswith("Recording"), "recording on")
                for i in (SLOW, DELAYED, OFF):
                    run_cell(page, i)
                wait_for(page, f"{OUTPUT}:has-text('p1: no delay')", 60)
                wait_idle(page, 60)
                named = _view_until(
                    page, lambda v: v["verdict"].startswith("p1 held"), "p1 named", timeout=60
                )
                page.locator(".jxs-stragglers").first.scroll_into_view_if_needed()
                screenshot(page, "stragglers.png")
                assert named["verdict"].startswith("p1 held the others up, in host (5 steps"), named
                assert [s["last"] for s in named["steps"]] == ["p1"] * 5, named
                assert {s["category"] for s in named["steps"]} == {"host"}, named
                # A breakdown bar per process; p1's host part holds the 200 ms delay.
                assert sorted(b["name"] for b in named["bars"]) == ["p0", "p1"], named
                p1 = next(b for b in named["bars"] if b["name"] == "p1")
                host = next(t for t in p1["parts"] if t.startswith("p1 host "))
                assert float(host.split()[2]) >= 190, p1

                # Without the delay, the next cell's steps no longer name p1.
                run_cell(page, UNDELAYED)
                wait_idle(page, 60)
                _view_until(
                    page,
                    lambda v: "p1 held" not in v["verdict"] and v["verdict"].endswith("processes)"),
                    "a verdict without p1",
                    timeout=60,
                )
                assert_no_errors(page)
                assert page.locator(".jxs-error").count() == 0
            except BaseException:
                screenshot(page, "stragglers-failure.png")
                print(lab.log_tail())
                raise
    assert lab.killed == [], f"outlived the server's shutdown: {lab.killed}"
    assert wait_no_processes(tag, timeout=15) == []
    print(f"browser straggler test: {time.monotonic() - t0:.1f} s")
