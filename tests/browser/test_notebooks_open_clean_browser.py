"""Every course notebook opens in JupyterLab unmodified.

Lab copies the kernel's ``language_info`` into a notebook it opens; when that changes the
notebook's metadata, the notebook is marked modified and Lab's autosave rewrites the file. Copies
of the course notebooks are opened one by one in a real Lab, in chromium, on one jaxsys kernel;
none may be marked modified. A copy holding only the language's name, as the notebooks once
did, must be marked modified: the check itself can fail.
"""

from __future__ import annotations

import shutil

import nbformat
import pytest

from ..harness import wait_no_processes
from ..unit.test_notebooks import NOTEBOOKS
from . import _KERNEL_STATUS, Lab, available, launch, screenshot, wait_for

REASON = available()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

# Once the kernel's info is in, wait until the notebook's language_info equals the kernel's
# (true at once for a notebook that already holds it; true after Lab's copy otherwise).
SETTLED = """async () => {
  const w = window.jupyterapp.shell.currentWidget;
  const info = await w.sessionContext.session.kernel.info;
  const stored = w.context.model.getMetadata('language_info');
  return JSON.stringify(stored) === JSON.stringify(info.language_info);
}"""
DIRTY = "() => window.jupyterapp.shell.currentWidget.context.model.dirty"
# Each notebook is opened in the same page, as a user opens one from the file browser (one
# page load for all). The first starts a jaxsys kernel; the others are opened on that kernel
# (as with "use the kernel of another notebook"), whose kernel_info they are compared with.
OPEN = """(args) => {
  const [path, id] = args;
  void window.jupyterapp.commands.execute('docmanager:open', id ? {path, kernel: {id}} : {path});
}"""
OPENED = f"""(path) => window.jupyterapp.shell.currentWidget?.context?.path === path
  && ({_KERNEL_STATUS})() === 'idle'"""
KERNEL_ID = "() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.id"
# Close the tab without a save dialog; the kernel stays for the next notebook.
CLOSE = "() => { window.jupyterapp.shell.currentWidget.dispose(); }"


def _opens_modified(page, name: str, kernel_id: str | None) -> tuple[bool, str]:
    """Whether notebook ``name`` is marked modified once open, and its kernel's id."""
    print("opening", name, flush=True)
    page.evaluate(OPEN, [name, kernel_id])
    page.wait_for_function(OPENED, arg=name, timeout=120_000)
    wait_for(page, ".jp-NotebookPanel .jp-Cell", 120)
    page.wait_for_function(SETTLED, timeout=60_000)
    dirty, kernel = page.evaluate(DIRTY), page.evaluate(KERNEL_ID)
    page.evaluate(CLOSE)
    return dirty, kernel


def test_course_notebooks_open_unmodified_in_lab(tag, tmp_path):
    root = tmp_path / "course"
    root.mkdir()
    for path in NOTEBOOKS:
        shutil.copy(path, root / path.name)
    control = nbformat.read(NOTEBOOKS[0], as_version=4)
    control.metadata["language_info"] = {"name": "python"}
    nbformat.write(control, root / "name-only.ipynb")
    with Lab(root, work_dir=tmp_path / "lab") as lab:
        with launch(width=1200, height=900) as page:
            try:
                page.goto(lab.page_url("lab?reset"), timeout=120_000)  # no tab restored
                page.wait_for_function("() => window.jupyterapp?.shell", timeout=120_000)
                page.evaluate("async () => { await window.jupyterapp.restored; }")
                kernel, modified = None, []
                for path in NOTEBOOKS:
                    dirty, kernel = _opens_modified(page, path.name, kernel)
                    if dirty:
                        modified.append(path.name)
                control_modified, _ = _opens_modified(page, "name-only.ipynb", kernel)
                kernels = lab.kernels()
            except BaseException:
                screenshot(page, "notebooks-open-clean-failure.png")
                print(lab.log_tail())
                raise
    assert [k["name"] for k in kernels] == ["jaxsys"], kernels
    assert control_modified, "a notebook whose language_info Lab changes must show as modified"
    assert modified == [], f"marked modified on open: {modified}"
    for path in NOTEBOOKS:  # nothing was written back either
        assert (root / path.name).read_bytes() == path.read_bytes(), path.name
    assert lab.killed == [], f"outlived the server's shutdown: {lab.killed}"
    assert wait_no_processes(tag, timeout=15) == []
