"""Every course notebook opens in JupyterLab unmodified.

Lab copies the kernel's ``language_info`` into a notebook it opens; when that changes the
notebook's metadata, the notebook is marked modified and Lab's autosave rewrites the file. Copies
of the course notebooks are opened one by one in a real Lab with the jaxsys kernel, in chromium;
none may be marked modified. A copy holding only the language's name, as the notebooks once
did, must be marked modified: the check itself can fail.
"""

from __future__ import annotations

import shutil

import nbformat
import pytest

from ..harness import wait_no_processes
from ..unit.test_notebooks import NOTEBOOKS
from . import Lab, available, launch, open_notebook, screenshot

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
# Shut the kernel down, so no kernel piles up; the next page load resets the workspace.
SHUTDOWN = "async () => { await window.jupyterapp.shell.currentWidget.sessionContext.shutdown(); }"


def _opens_modified(page, lab: Lab, name: str) -> bool:
    print("opening", name, flush=True)
    open_notebook(page, lab, f"{name}?reset")  # ?reset: no tab of the last notebook restored
    page.wait_for_function(SETTLED, timeout=60_000)
    dirty = page.evaluate(DIRTY)
    page.evaluate(SHUTDOWN)
    return dirty


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
                modified = [p.name for p in NOTEBOOKS if _opens_modified(page, lab, p.name)]
                control_modified = _opens_modified(page, lab, "name-only.ipynb")
            except BaseException:
                screenshot(page, "notebooks-open-clean-failure.png")
                print(lab.log_tail())
                raise
    assert control_modified, "a notebook whose language_info Lab changes must show as modified"
    assert modified == [], f"marked modified on open: {modified}"
    for path in NOTEBOOKS:  # nothing was written back either
        assert (root / path.name).read_bytes() == path.read_bytes(), path.name
    assert lab.killed == [], f"outlived the server's shutdown: {lab.killed}"
    assert wait_no_processes(tag, timeout=15) == []
