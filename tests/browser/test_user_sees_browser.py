"""What a reader of a jaxsys notebook in JupyterLab sees, checked in the page's DOM.

One Lab server, one notebook on the jaxsys kernel and one 2-process cluster serve the whole
module; the tests run in file order on the same page, each driving one or two cells:

- start-up progress and ``%jaxsys restart`` are plain output, never Lab's pink stderr;
- a mistyped action or option answers "did you mean";
- two processes failing with messages that differ in one value show one traceback, a table
  of the values, and the cell number the notebook's prompt shows;
- a click in the sidebar while a cell runs leaves Lab's kernel status Busy until the cell ends;
- an interrupted collective puts the status bar and the sidebar in words into "out of step",
  in the status bar's warning colour, and a restart brings both back to "ready";
- a new notebook's sidebar shows nothing of another kernel's log.

Every test saves a screenshot under ``tests/artifacts/user-sees-*.png``.
"""

from __future__ import annotations

import re
import time

import pytest

from ..harness import write_notebook
from . import Lab, available, launch, open_notebook, open_sidebar, screenshot

REASON = available()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

STATUS = "#jaxsys-status"
SIDEBAR = "#jaxsys-sidebar"
STDERR = '.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]'

# Process 0 waits in a collective that process 1 never joins; the timeout interrupts both.
DIVERGE = (
    "%%multihost --timeout 2\n"
    "import jax, time\n"
    "from jax.experimental import multihost_utils\n"
    "if jax.process_index() == 0:\n"
    "    multihost_utils.sync_global_devices('only p0')\n"
    "else:\n"
    "    time.sleep(60)\n"
)
CELLS = [
    "%jaxsys start --hosts 2 --devices-per-host 1",
    "%jaxsys stauts",
    "%%multihost --timout 5\nprint('never runs')",
    "%%multihost\nimport jax\nraise ValueError(f'bad shard on device {jax.local_devices()[0].id}')",
    "%%multihost\nimport time\ntime.sleep(8)\nprint('slept')",
    DIVERGE,
    "%jaxsys restart",
]
START, STAUTS, TIMOUT, ERRORS, LONG, HANG, RESTART = range(len(CELLS))

# Lab's own kernel status, as its status bar writes it ("<kernel name> | Busy").
LAB_KERNEL_STATUS = """() => {
  const items = [...document.querySelectorAll('#jp-main-statusbar .jp-StatusBar-Item')];
  const texts = items.map((e) => e.textContent.trim());
  return texts.find((t) => /\\| *[A-Z][a-z]+$/.test(t) && t.includes('jaxsys')) ?? null;
}"""


@pytest.fixture(scope="module")
def page(tag, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("user-sees")
    root = tmp / "root"
    root.mkdir()
    write_notebook(root / "sees.ipynb", CELLS)
    write_notebook(root / "fresh.ipynb", ["print('a new kernel')"])
    with Lab(root, work_dir=tmp / "lab") as lab, launch(width=1400, height=1000) as page:
        open_notebook(page, lab, "sees.ipynb", timeout=120)
        open_sidebar(page)
        yield page


@pytest.fixture
def shot(page, request):
    """Screenshot the page as ``user-sees-failure-<test>.png`` when the test fails."""
    failed = request.session.testsfailed
    yield
    # The call's report is counted before teardown: a new failure is this test's.
    if request.session.testsfailed > failed:
        screenshot(page, f"user-sees-failure-{request.node.name}.png")


def cell(page, index: int):
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").nth(index)


def run(page, index: int, timeout: float = 60.0) -> int:
    """Run cell ``index``, wait for it to end, and return the number its prompt shows."""
    start(page, index)
    return finished(page, index, timeout)


def start(page, index: int) -> None:
    """Queue cell ``index`` without waiting for it (Lab's run command resolves at its end)."""
    page.evaluate(
        "(i) => { const nb = window.jupyterapp.shell.currentWidget.content;"
        " const c = nb.widgets[i]; c.__promptBefore = c.promptNode.textContent;"
        " nb.activeCellIndex = i; window.jupyterapp.commands.execute('notebook:run-cell'); }",
        index,
    )
    # Queued: its prompt shows '*', or a quick cell has already changed it to its number.
    page.wait_for_function(
        "(i) => { const c = window.jupyterapp.shell.currentWidget.content.widgets[i];"
        " const t = c.promptNode.textContent; return t.includes('*') || t !== c.__promptBefore; }",
        arg=index,
        timeout=10_000,
    )


def outputs(page, index: int) -> list[dict]:
    """The outputs of cell ``index`` as the notebook model holds them (nbformat JSON)."""
    return page.evaluate(
        "(i) => window.jupyterapp.shell.currentWidget.content.widgets[i].model.outputs.toJSON()",
        index,
    )


def kinds(page, index: int) -> list[str]:
    """``stream:stdout``, ``error``, ...: what each output of cell ``index`` is."""
    return [
        f"{o['output_type']}:{o['name']}" if o["output_type"] == "stream" else o["output_type"]
        for o in outputs(page, index)
    ]


def prompt(page, index: int) -> str:
    return cell(page, index).locator(".jp-InputArea-prompt").inner_text()


def finished(page, index: int, timeout: float = 60.0) -> int:
    page.wait_for_function(
        "(i) => { const c = window.jupyterapp.shell.currentWidget.content.widgets[i];"
        " return /\\[\\d+\\]/.test(c.promptNode.textContent); }",
        arg=index,
        timeout=timeout * 1000,
    )
    return int(re.search(r"\[(\d+)\]", prompt(page, index)).group(1))


def show(page, index: int, name: str) -> None:
    """Bring cell ``index`` into view and save a screenshot ``user-sees-<name>.png``."""
    cell(page, index).scroll_into_view_if_needed()
    screenshot(page, f"user-sees-{name}.png")


def status_bar(page, text: str, timeout: float = 60.0) -> str:
    page.wait_for_function(
        "(t) => document.getElementById('jaxsys-status')?.textContent.includes(t)",
        arg=text,
        timeout=timeout * 1000,
    )
    return page.locator(STATUS).inner_text()


def summary(page) -> str:
    return page.locator(f"{SIDEBAR} .jaxsys-summary").inner_text()


def warns(page, selector: str) -> bool:
    return "jaxsys-mod-warning" in (page.locator(selector).get_attribute("class") or "")


def background(page) -> str:
    return page.evaluate(
        "() => getComputedStyle(document.getElementById('jaxsys-status')).backgroundColor"
    )


def test_start_progress_is_plain_output(page, shot):
    run(page, START, timeout=180)
    text = status_bar(page, "ready", timeout=60)
    assert text.startswith("jaxsys: ready · 2/2 processes alive"), text
    out = cell(page, START).locator(".jp-OutputArea").inner_text()
    assert " ready in " in out and "processes initialised 2/2" in out, out
    # Progress is ordinary output: nothing of it painted as an error stream.
    assert cell(page, START).locator(STDERR).count() == 0
    assert "stream:stderr" not in kinds(page, START), kinds(page, START)
    show(page, START, "start")


def test_mistypes_answer_did_you_mean(page, shot):
    run(page, STAUTS)
    said = cell(page, STAUTS).locator(".jp-OutputArea").inner_text()
    assert "did you mean 'status'" in said, said
    run(page, TIMOUT)
    said = cell(page, TIMOUT).locator(".jp-OutputArea").inner_text()
    assert "--timeout" in said and "did you mean" in said, said
    assert "invalid choice" not in said and "never runs" not in said, said
    show(page, TIMOUT, "did-you-mean")


def test_errors_differing_in_a_value_show_one_traceback(page, shot):
    n = run(page, ERRORS)
    # Lab paints an error like stderr; the model says which outputs are errors.
    assert kinds(page, ERRORS) == ["error"], kinds(page, ERRORS)
    text = cell(page, ERRORS).locator(".jp-OutputArea").inner_text()
    assert text.count("Traceback (most recent call last)") == 1, text
    assert "[p0-1] ValueError: bad shard on device <device>" in text, text
    assert re.search(r"device: \d+ on p0, \d+ on p1", text), text
    assert "ValueError on p0, ValueError on p1" not in text, text
    # The traceback names the cell by the number its prompt shows.
    assert f"In[{n}]" in text, (n, text)
    show(page, ERRORS, "grouped-error")


def test_a_sidebar_click_during_a_cell_leaves_lab_busy(page, shot):
    start(page, LONG)
    page.wait_for_function(f"() => ({LAB_KERNEL_STATUS})()?.endsWith('Busy')", timeout=10_000)
    stacks = page.locator(f"{SIDEBAR} button.jaxsys-stacks")
    log = page.locator(f"{SIDEBAR} .jaxsys-log")
    answers = log.inner_text().count("stacks of")
    stacks.click()
    seen, answered_while_running = [], False
    deadline = time.monotonic() + 60
    while "*" in prompt(page, LONG):
        assert time.monotonic() < deadline, "the cell did not end within 60 s"
        seen.append(page.evaluate(LAB_KERNEL_STATUS))
        if not answered_while_running and log.inner_text().count("stacks of") > answers:
            answered_while_running = True
            show(page, LONG, "busy-after-click")
        page.wait_for_timeout(200)  # a poll interval, not a wait for something
    assert answered_while_running, "Dump stacks was not answered while the cell ran"
    assert seen and all(s.endswith("Busy") for s in seen[:-1]), seen
    page.wait_for_function(f"() => ({LAB_KERNEL_STATUS})()?.endsWith('Idle')", timeout=10_000)
    assert "slept" in cell(page, LONG).locator(".jp-OutputArea").inner_text()


def test_out_of_step_is_said_and_restart_clears_it(page, shot):
    ready_bg = background(page)
    run(page, HANG, timeout=120)
    text = status_bar(page, "out of step", timeout=30)
    assert "jaxsys: out of step" in text, text
    assert warns(page, STATUS) and page.locator(STATUS).get_attribute("data-state") == "warning"
    assert background(page) != ready_bg
    page.wait_for_function(
        "() => document.querySelector('#jaxsys-sidebar .jaxsys-summary')"
        "?.textContent.startsWith('out of step')",
        timeout=30_000,
    )
    assert warns(page, f"{SIDEBAR} .jaxsys-summary")
    show(page, HANG, "out-of-step")

    run(page, RESTART, timeout=180)
    text = status_bar(page, "jaxsys: ready", timeout=60)
    assert not warns(page, STATUS) and background(page) == ready_bg, text
    page.wait_for_function(
        "() => document.querySelector('#jaxsys-sidebar .jaxsys-summary')"
        "?.textContent.startsWith('ready')",
        timeout=30_000,
    )
    assert not warns(page, f"{SIDEBAR} .jaxsys-summary")
    # A restart is news, not an error: no stderr element, not even an empty one.
    assert cell(page, RESTART).locator(STDERR).count() == 0
    # Plain output only: the restart's lines, and its progress as display outputs.
    assert kinds(page, RESTART) and set(kinds(page, RESTART)) <= {"stream:stdout", "display_data"}
    assert "stream:stdout" in kinds(page, RESTART)
    show(page, RESTART, "restarted")


def test_a_new_notebook_shows_none_of_the_old_log(page, shot):
    old_pid = page.locator(SIDEBAR).get_attribute("data-kernel-pid")
    old_log = [line for line in page.locator(f"{SIDEBAR} .jaxsys-log").inner_text().splitlines()]
    assert old_log, "the first kernel's log is empty: nothing to compare"
    page.evaluate(
        "() => window.jupyterapp.commands.execute('docmanager:open', {path: 'fresh.ipynb'})"
    )
    page.wait_for_function(
        "(pid) => { const s = document.getElementById('jaxsys-sidebar');"
        " return s && s.dataset.kernelPid && s.dataset.kernelPid !== pid; }",
        arg=old_pid,
        timeout=60_000,
    )
    status_bar(page, "no cluster", timeout=30)
    assert summary(page) == "no cluster"
    new_log = page.locator(f"{SIDEBAR} .jaxsys-log").inner_text()
    assert not [line for line in old_log if line.strip() and line in new_log], new_log
    screenshot(page, "user-sees-new-notebook.png")
