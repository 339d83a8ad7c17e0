"""Every control of the jaxsys sidebar lies inside the panel at its default width, and no
header is cut (headless chromium, a real JupyterLab and kernel).

A cell in the kernel installs a stand-in cluster into the kernel's own session: two real
``ProcessInfo`` records with what makes a row wide (a long host name, four devices, a
process restarted alone twice, one busy) and no telemetry, so the comm reports the
cluster's own view. Everything from the comm's ``cluster_state`` to the sidebar is the
product's. The same check runs on a cluster of 256 processes in
``test_sidebar_groups_browser.py``.

Screenshot: ``tests/artifacts/sidebar-reach.png``.
"""

from __future__ import annotations

import pytest

from ..browser import (
    OUTPUT,
    Lab,
    assert_no_errors,
    available,
    launch,
    open_notebook,
    open_sidebar,
    run_cell,
    screenshot,
    wait_for,
    wait_idle,
)
from ..harness import write_notebook
from .reach import assert_in_reach

REASON = available()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

STATUS = "#jaxsys-status"
SIDEBAR = "#jaxsys-sidebar"
HOST = "gpu-node-0042.cluster.example.org"

INSTALL = f"""\
from types import SimpleNamespace

import jaxsys_kernel
from jaxsys_kernel.cluster.records import ProcessInfo

procs = [ProcessInfo(rank=r, host={HOST!r}, devices=[4 * r + d for d in range(4)],
                     state="ready") for r in range(2)]
jaxsys_kernel.session().cluster = SimpleNamespace(
    state="ready", nprocs=2, processes=procs, telemetry=None,
    world=SimpleNamespace(incarnation=1, rank_restarts={{1: 2}}),
    security="mTLS (stand-in)", heartbeat_timeout=10.0, refresh_states=lambda: None,
    rotation=lambda: None, refusal_records=lambda: [], kill=lambda: 0.0,
)
get_ipython().kernel.jaxsys_comms.push(full=True)
print("stand-in installed")
"""

REMOVE = """\
jaxsys_kernel.session().cluster = None
get_ipython().kernel.jaxsys_comms.push(full=True)
print("stand-in removed")
"""


def test_every_sidebar_control_inside_the_panel(tag, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    write_notebook(root / "reach.ipynb", [INSTALL, REMOVE])
    with Lab(root, work_dir=tmp_path / "lab") as lab, launch(width=1600, height=1000) as page:
        try:
            open_notebook(page, lab, "reach.ipynb", timeout=120)
            page.wait_for_function(
                "() => document.getElementById('jaxsys-status')?.textContent"
                " === 'jaxsys: no cluster'",
                timeout=60_000,
            )
            open_sidebar(page)
            run_cell(page, 0)
            wait_for(page, f"{OUTPUT}:has-text('stand-in installed')", 60)
            wait_idle(page, 60)
            assert_no_errors(page)
            page.wait_for_function(
                "() => document.querySelectorAll('#jaxsys-sidebar tr.jaxsys-process').length === 2",
                timeout=30_000,
            )
            screenshot(page, "sidebar-reach.png")
            v = assert_in_reach(page, rows=2)
            # At Lab's default sidebar width, not a widened one.
            assert v["width"] < 300, v
            # The row says its restarts, and a cut host is whole in its title.
            first = page.locator(f"{SIDEBAR} tr.jaxsys-process[data-rank='1'] td").nth(0)
            assert first.inner_text() == "p1 ↻2"
            host = page.locator(f"{SIDEBAR} tr.jaxsys-process[data-rank='0'] td").nth(1)
            assert HOST in (host.get_attribute("title") or ""), host.get_attribute("title")
            # The buttons answer a click where they are drawn: the confirmation opens.
            page.locator(f"{SIDEBAR} tr.jaxsys-process[data-rank='1'] button.jaxsys-kill").click(
                trial=True
            )
            run_cell(page, 1)
            wait_for(page, f"{OUTPUT}:has-text('stand-in removed')", 60)
        except BaseException:
            screenshot(page, "sidebar-reach-failure.png")
            print(lab.log_tail())
            raise
    assert lab.killed == [], f"outlived the server's shutdown: {lab.killed}"
