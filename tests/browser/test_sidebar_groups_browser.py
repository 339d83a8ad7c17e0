"""The jaxsys sidebar in a real JupyterLab (headless chromium) for a cluster of 256 processes:
it shows a summary, not 256 rows, and a click on a group shows that group's rows.

Above ``aggregate.ROWS_UP_TO`` processes the kernel's comm sends counts by state, at most 32
groups of consecutive ranks and the errors processes share, plus the rows of the one group
the front end opened. Nothing here can run 256 JAX processes, so a cell in the kernel
installs a stand-in cluster into the kernel's own session: 256 real ``ProcessInfo`` records
and a real ``TelemetryHub`` that ``SimulatedAgents`` (``tests/support_telemetry.py``) feed
over its CurveZMQ socket, one agent per rank. Everything from the hub to the sidebar is the
product's: the comm's ``cluster_state`` and deltas, the extension's link, model and
sidebar, and Lab itself.

Three processes are unwell, so the summary has something to point at: p42 and p45 are
recorded dead with the same error (their agents never beat, as killed processes would not),
and p203's agent goes silent after a few beats, so only its heartbeats say it is gone.

What is checked in the page's DOM:

- the sidebar shows ``256 processes in 32 groups of 8``, the counts by state add up to 256,
  the 32 groups cover ranks 0-255 in eights and each group's counts add up to 8, every group
  fits the sidebar's default width, and no process row is drawn;
- the groups holding the unwell processes are marked by their worst state, and the shared
  error names its two ranks;
- a click on the group of p42 and p45 shows exactly ranks 40-47, those two dead; a click on
  the group of p203 switches the rows to exactly 200-207, p203 dead (or stuck); the way back
  hides the rows again, the live-devices section then points at the groups, and while no
  group is open the way-back button is not on the page
  (not even as an empty box);
- once the cell that removes the stand-in has run, the simulated agents are gone and the
  sidebar says ``no cluster``; the kernel shuts down, and no process the test started is
  left.

Screenshots go to ``tests/artifacts/sidebar-groups-*.png``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from jaxsys_kernel.cluster.teardown import pid_alive

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
from ..harness import wait_no_processes, write_notebook
from .reach import assert_in_reach

REASON = available()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

STATUS = "#jaxsys-status"
SIDEBAR = "#jaxsys-sidebar"
STDERR = '.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]'
#: The repository root, for the kernel to import ``tests.support_telemetry`` from.
REPO = str(Path(__file__).resolve().parents[2])

N = 256
GROUPS = 32
SIZE = N // GROUPS
#: Recorded dead, with one error shared by both (group 5: p40-47).
DEAD = (42, 45)
ERROR = "the engine exited with SIGKILL"
#: Its agent stops beating; only the hub's heartbeats can tell (group 25: p200-207).
SILENT = 203
ODD_GROUP, SILENT_GROUP = DEAD[0] // SIZE, SILENT // SIZE

# Cell 0 runs in the kernel process (not %%multihost): a stand-in for the Cluster the comm
# reads, made of the real records and the real hub, put where %jaxsys start puts a cluster.
# The stand-in has what cluster_state reads, plus what the kernel's post-cell hooks
# (rotation, refusal_records) and its shutdown (kill) call on a cluster.
INSTALL = f"""\
import sys
from types import SimpleNamespace

sys.path.insert(0, {REPO!r})
import jaxsys_kernel
from jaxsys_kernel.cluster.records import ProcessInfo
from jaxsys_kernel.telemetry.hub import TelemetryHub
from tests.support_telemetry import SimulatedAgents

hub = TelemetryHub({N}, curve=True, interval=1.0)
# p42 and p45 never beat (they are dead); p203 stops after 3.5 s. Two workers of 128
# sockets each: the machine has two cores.
silent = {{**dict.fromkeys({DEAD!r}, 0.0), {SILENT}: 3.5}}
agents = SimulatedAgents(hub, {N}, interval=1.0, silent_after=silent, workers=2).__enter__()
procs = [
    ProcessInfo(rank=r, host=f"node{{r // 32}}", devices=[r], state="ready")
    for r in range({N})
]
for r in {DEAD!r}:
    procs[r].mark_dead({ERROR!r})


def kill():
    agents.__exit__(None, None, None)
    hub.close()
    return 0.0


jaxsys_kernel.session().cluster = SimpleNamespace(
    state="ready",
    nprocs={N},
    processes=procs,
    telemetry=hub,
    security="CurveZMQ telemetry (simulated agents)",
    heartbeat_timeout=10.0,
    refresh_states=lambda: None,
    rotation=lambda: None,
    refusal_records=lambda: [],
    kill=kill,
)
get_ipython().kernel.jaxsys_comms.push(full=True)
print("simulated agents:", *agents.pids())
"""

# Cell 1: no cluster again; the push unsubscribes the comm from the hub before it closes.
REMOVE = """\
jaxsys_kernel.session().cluster = None
get_ipython().kernel.jaxsys_comms.push(full=True)
agents.__exit__(None, None, None)
hub.close()
print("simulated agents stopped")
"""

CELLS = [INSTALL, REMOVE]

# What the sidebar draws for the groups, read in one go so that a push cannot land between
# two reads.
VIEW = """() => {
  const side = document.getElementById('jaxsys-sidebar');
  const groups = side?.querySelector('.jaxsys-groups');
  if (!side || !groups) return null;
  const all = (s) => [...side.querySelectorAll(s)];
  const box = side.getBoundingClientRect();
  const back = side.querySelector('.jaxsys-groups-back');
  const shown = (node) => node.getClientRects().length > 0;
  return {
    visible: shown(groups),
    summary: side.querySelector('.jaxsys-summary').textContent,
    line: groups.querySelector('.jaxsys-groups-line').textContent,
    open: groups.dataset.open ?? null,
    groups: all('button.jaxsys-group').map((b) => ({
      group: Number(b.dataset.group),
      worst: b.dataset.worst,
      text: b.textContent,
      open: b.classList.contains('jaxsys-mod-open'),
      fits: b.scrollWidth <= b.clientWidth && b.getBoundingClientRect().right <= box.right,
    })),
    errors: all('.jaxsys-group-error').map((e) => e.textContent),
    // What the user sees, not the attribute: a stylesheet's display can undo 'hidden'.
    back: shown(back) ? back.textContent : null,
    table: shown(side.querySelector('table.jaxsys-processes')),
    devices: side.querySelector('.jaxsys-devices')?.textContent ?? null,
    rows: all('tr.jaxsys-process').map((r) => ({
      rank: Number(r.dataset.rank),
      state: r.dataset.state,
      text: r.cells[3].textContent,
    })),
  };
}"""


def view(page) -> dict | None:
    return page.evaluate(VIEW)


def until(page, check, what: str, timeout: float = 60.0) -> dict:
    """Poll the sidebar's view until ``check(view)`` holds; return that view."""
    deadline = time.monotonic() + timeout
    while True:
        v = view(page)
        if v is not None and check(v):
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s; the sidebar shows {v}")
        page.wait_for_timeout(100)  # a poll interval, not a wait for something


def counts(text: str) -> dict[str, int]:
    """``253 alive · 3 dead`` (or ``6 alive, 2 dead``) as ``{"alive": 253, "dead": 3}``."""
    pairs = (part.split(" ", 1) for part in re.split(r" · |, ", text) if part)
    return {state: int(n) for n, state in pairs}


def by_state(v: dict) -> dict[str, int]:
    """The summary line's counts by state."""
    head = f"{N} processes in {GROUPS} groups of {SIZE}: "
    return counts(v["line"].removeprefix(head)) if v["line"].startswith(head) else {}


def settled(v: dict) -> bool:
    """Every agent heard from, and the three unwell processes counted."""
    states = by_state(v)
    return v["visible"] and states.get("alive") == N - 3 and sum(states.values()) == N


def group_counts(g: dict) -> dict[str, int]:
    """A group button's counts: ``p40-47: 6 alive, 2 dead`` as ``{"alive": 6, "dead": 2}``."""
    return counts(g["text"].split(": ", 1)[1])


def rows_of(v: dict) -> list[int]:
    return [r["rank"] for r in v["rows"]]


def unwell_rows(v: dict) -> dict[int, str]:
    """The rows shown in another state than alive, by rank."""
    return {r["rank"]: r["state"] for r in v["rows"] if r["state"] != "alive"}


def showing(ranks: list[int], unwell) -> Callable[[dict], bool]:
    """A check for :func:`until`: exactly ``ranks`` are shown, the ``unwell`` ones not alive.

    Waited for rather than read once: a row whose agent is briefly late on a busy machine
    is shown late for that moment, and the next push puts it right.
    """
    return lambda v: rows_of(v) == ranks and unwell_rows(v).keys() == set(unwell)


def group_button(page, group: int):
    return page.locator(f"{SIDEBAR} button.jaxsys-group[data-group='{group}']")


def test_sidebar_summarizes_256_processes_and_opens_a_group(tag, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    write_notebook(root / "groups.ipynb", CELLS)
    t0 = time.monotonic()
    with Lab(root, work_dir=tmp_path / "lab") as lab, launch(width=1400, height=900) as page:
        try:
            open_notebook(page, lab, "groups.ipynb", timeout=120)
            page.wait_for_function(
                "() => document.getElementById('jaxsys-status')?.textContent"
                " === 'jaxsys: no cluster'",
                timeout=60_000,
            )
            open_sidebar(page)

            run_cell(page, 0)
            wait_for(page, f"{OUTPUT}:has-text('simulated agents:')", 120)
            wait_idle(page, 60)
            assert_no_errors(page)
            # The stand-in satisfies the kernel's own hooks: nothing complains after the cell.
            assert page.locator(STDERR).count() == 0, page.locator(STDERR).all_inner_texts()
            said = page.locator(f"{OUTPUT}:has-text('simulated agents:')").inner_text()
            workers = [int(p) for p in said.split(":", 1)[1].split()]
            assert len(workers) == 2, said

            # The summary: 32 groups of 8, counts by state that add up to 256, no rows.
            v = until(page, settled, f"the summary of {N} processes, 3 unwell", timeout=90)
            states = by_state(v)
            assert sum(states.values()) == N, v["line"]
            # p42 and p45 are dead by the cluster's record; p203 by its heartbeats, or
            # stuck if the last beat it sent said busy: red in the sidebar either way.
            assert states["dead"] >= len(DEAD) and set(states) <= {"alive", "dead", "stuck"}
            assert len(v["groups"]) == GROUPS
            assert [g["group"] for g in v["groups"]] == list(range(GROUPS))
            assert [g["text"].split(":")[0] for g in v["groups"]] == [
                f"p{g * SIZE}-{g * SIZE + SIZE - 1}" for g in range(GROUPS)
            ]
            assert [sum(group_counts(g).values()) for g in v["groups"]] == [SIZE] * GROUPS
            unwell = {g["group"]: g["worst"] for g in v["groups"] if g["worst"] != "alive"}
            assert unwell.keys() == {ODD_GROUP, SILENT_GROUP}, unwell
            assert unwell[ODD_GROUP] == "dead"
            odd = v["groups"][ODD_GROUP]
            assert group_counts(odd) == {"alive": SIZE - len(DEAD), "dead": len(DEAD)}, odd
            assert v["errors"] == [f"p{DEAD[0]},{DEAD[1]}: {ERROR}"], v["errors"]
            # Readable at the sidebar's default width: no group's label is cut off.
            assert all(g["fits"] for g in v["groups"]), [g for g in v["groups"] if not g["fits"]]
            assert v["open"] == "" and v["back"] is None
            assert v["rows"] == [] and not v["table"]
            # The live-devices section says where its devices are, rather than nothing.
            assert v["devices"] == "Open a group above to see its devices.", v["devices"]
            assert f"{N - 3}/{N} processes alive" in v["summary"], v["summary"]
            screenshot(page, "sidebar-groups-summary.png")

            # A click on the group holding p42 and p45: its rows, and only those.
            group_button(page, ODD_GROUP).click()
            ranks = list(range(ODD_GROUP * SIZE, (ODD_GROUP + 1) * SIZE))
            v = until(page, showing(ranks, DEAD), f"the rows of group {ODD_GROUP}", 30)
            assert v["open"] == str(ODD_GROUP) and v["table"]
            assert [g["group"] for g in v["groups"] if g["open"]] == [ODD_GROUP]
            assert v["back"] == f"← all groups (showing p{ranks[0]}-{ranks[-1]})", v["back"]
            assert unwell_rows(v) == dict.fromkeys(DEAD, "dead"), v["rows"]
            # The state column says it in words, not only in colour.
            assert [r["text"] for r in v["rows"] if r["rank"] in DEAD] == ["dead"] * len(DEAD)
            # The odd rows are drawn in the state's (red) class, visible on the page.
            for r in DEAD:
                cell = page.locator(f"{SIDEBAR} tr.jaxsys-process[data-rank='{r}'] td").nth(3)
                assert "jaxsys-state-dead" in (cell.get_attribute("class") or "")
                cell.scroll_into_view_if_needed()
                assert cell.is_visible()
            screenshot(page, "sidebar-groups-open-dead.png")
            # Every row's kill and restart inside the panel, every header whole.
            assert_in_reach(page, rows=SIZE)

            # Another group: the rows switch to it, none of the first group's stay.
            group_button(page, SILENT_GROUP).click()
            ranks = list(range(SILENT_GROUP * SIZE, (SILENT_GROUP + 1) * SIZE))
            v = until(page, showing(ranks, [SILENT]), f"the rows of group {SILENT_GROUP}", 30)
            assert v["open"] == str(SILENT_GROUP)
            assert [g["group"] for g in v["groups"] if g["open"]] == [SILENT_GROUP]
            assert v["back"] == f"← all groups (showing p{ranks[0]}-{ranks[-1]})", v["back"]
            assert unwell_rows(v)[SILENT] in ("dead", "stuck"), v["rows"]
            screenshot(page, "sidebar-groups-open-silent.png")

            # Back to all groups: the rows go, the groups stay.
            page.locator(f"{SIDEBAR} .jaxsys-groups-back").click()
            v = until(page, lambda v: v["rows"] == [] and v["open"] == "", "back to the groups", 30)
            assert not v["table"] and v["back"] is None and len(v["groups"]) == GROUPS

            # Remove the stand-in: the agents stop while the kernel still runs.
            run_cell(page, 1)
            wait_for(page, f"{OUTPUT}:has-text('simulated agents stopped')", 60)
            wait_idle(page, 60)
            assert_no_errors(page)
            left = [p for p in workers if pid_alive(p)]
            assert left == [], f"simulated agents still running: {left}"
            page.wait_for_function(
                "() => document.querySelector('#jaxsys-sidebar .jaxsys-summary')?.textContent"
                " === 'no cluster'",
                timeout=30_000,
            )
            assert view(page)["visible"] is False

            # Shut the kernel down; its process must go.
            # The handle is taken first: the server answers once the kernel is gone.
            kernel_proc = psutil.Process(
                int(page.locator(SIDEBAR).get_attribute("data-kernel-pid"))
            )
            (kernel,) = lab.kernels()
            lab.api("DELETE", f"api/kernels/{kernel['id']}", timeout=30)
            _, alive = psutil.wait_procs([kernel_proc], timeout=30)
            assert alive == [], f"kernel {kernel_proc.pid} still running"
            assert lab.kernels() == []
        except BaseException:
            screenshot(page, "sidebar-groups-failure.png")
            print(lab.log_tail())
            raise
    assert lab.killed == [], f"outlived the server's shutdown: {lab.killed}"
    assert wait_no_processes(tag, timeout=15) == []
    print(f"sidebar groups test: {time.monotonic() - t0:.1f} s")
