"""A notebook saved by ``jaxsys run --output`` shows its pictures where notebooks are read.

The notebook runs on a real 2-process cluster through the real command line. The saved file
is then (a) converted by ``jupyter nbconvert --to html`` and opened in chromium from disk with
every other request refused (offline, no CDN), and (b) opened untrusted in JupyterLab and in
Notebook 7. In each, the mesh, sharding and scalar outputs must be drawn images of the right
size, and the run-together labels of a stripped SVG (``d0p0d1p0``) must not appear.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time

import nbformat
import pytest

from jaxsys_kernel import saved

from ..executed import NOTEBOOK_DIR, executed
from ..harness import wait_no_processes, write_notebook
from . import OUTPUT, Lab, available, launch, screenshot, wait_for

REASON = available()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

CELLS = [
    "%jaxsys start --hosts 2 --devices-per-host 2",
    "%%multihost\nimport jax\nmesh = jax.make_mesh((2, 2), ('x', 'y'))\nmesh",
    "%%multihost\n"
    "import numpy as np\n"
    "from jax.sharding import NamedSharding, PartitionSpec as P\n"
    "rows = np.full((4, 4), jax.process_index(), dtype=np.float32)\n"
    "arr = jax.make_array_from_process_local_data(NamedSharding(mesh, P('x', None)), rows)\n"
    "arr",
    "%%multihost\nimport jax.numpy as jnp\njax.device_put(jnp.float32(1), NamedSharding(mesh, P()))",
    "%jaxsys stop",
]
MESH, SHARDING, SCALAR = 1, 2, 3
# What a sanitizer leaves of an inline SVG: its labels, run together.
RUN_TOGETHER = re.compile(r"d\d+p\d+d\d+")

# The images of the page's outputs: [natural width, natural height, loaded] each.
IMAGES = """(sel) => [...document.querySelectorAll(sel)].map(
  (i) => [i.naturalWidth, i.naturalHeight, i.complete && i.naturalWidth > 0])"""


def _run(tmp_path):
    src, out = tmp_path / "views.ipynb", tmp_path / "saved" / "views.ipynb"
    out.parent.mkdir()
    write_notebook(src, CELLS)
    t0 = time.monotonic()
    # Run from the notebook's folder: jaxsys run's kernel sockets are named relative to the
    # working directory, and the kernel starts in the notebook's folder.
    r = subprocess.run(
        [sys.executable, "-m", "jaxsys_kernel.cli", "run", src.name, "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=src.parent,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    print(f"jaxsys run --output: {time.monotonic() - t0:.1f} s")
    return out


def _check_saved(nb) -> None:
    assert "widgets" not in nb.metadata and saved.widget_state_problems(nb) == []
    assert nb.metadata.kernelspec.name == "jaxsys" and all(c.get("id") for c in nb.cells)
    for i in (MESH, SHARDING, SCALAR):
        (view,) = [o for o in nb.cells[i].outputs if "image/png" in o.get("data", {})]
        assert "text/html" not in view.data, i
        assert not RUN_TOGETHER.search(view.data["text/plain"]), view.data["text/plain"]


def _check_images(sizes: list, where: str) -> None:
    assert len(sizes) == 3 and all(ok for _, _, ok in sizes), (where, sizes)
    (mw, mh, _), (sw, sh, _), (cw, ch, _) = sizes
    # The mesh: a 2 x 2 grid of 56-pixel cells under two caption lines; the sharding: two
    # blocks of 120 x 52; the scalar: one block. All sized to content, none a poster.
    assert 100 < mh < 260 and mw < 700, (where, sizes)
    assert 150 < sh < 300 and sw < 800, (where, sizes)
    assert ch < sh and cw < 800, (where, sizes)


def _nbconvert_offline(path, tmp_path) -> None:
    html_dir = tmp_path / "html"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "nbconvert",
            "--to",
            "html",
            str(path),
            "--output-dir",
            str(html_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    page_path = html_dir / "views.html"
    blocked: list[str] = []
    with launch(width=1200, height=1400) as page:

        def only_files(route):
            if route.request.url.startswith(("file:", "data:")):
                route.continue_()
            else:
                blocked.append(route.request.url)
                route.abort()

        page.route("**/*", only_files)
        page.goto(page_path.as_uri())
        page.wait_for_load_state("load")
        sizes = page.evaluate(IMAGES, ".jp-OutputArea-output img")
        text = page.locator("body").inner_text()
        screenshot(page, "saved-nbconvert-offline.png")
    print(f"nbconvert page: blocked {len(blocked)} requests ({sorted(set(blocked))[:4]})")
    _check_images(sizes, "nbconvert")
    assert not RUN_TOGETHER.search(text), RUN_TOGETHER.search(text)


def _open_untrusted(page, lab: Lab, url_path: str) -> list:
    page.goto(lab.page_url(url_path), timeout=120_000)
    wait_for(page, ".jp-NotebookPanel .jp-Cell", 120)
    page.wait_for_function(
        f"() => document.querySelectorAll('{OUTPUT} img').length >= 3 && "
        f"[...document.querySelectorAll('{OUTPUT} img')].every((i) => i.complete)",
        timeout=60_000,
    )
    trusted = page.evaluate(
        "() => [...window.jupyterapp.shell.currentWidget.content.model.cells].map((c) => c.trusted)"
    )
    assert not any(trusted), trusted  # the file was never signed: no cell is trusted
    text = page.locator(".jp-NotebookPanel").inner_text()
    assert not RUN_TOGETHER.search(text), RUN_TOGETHER.search(text)
    assert "Error displaying widget" not in text
    return page.evaluate(IMAGES, f"{OUTPUT} img")


def _saved_quickstart(folder):
    """The quickstart as the suite executed it (saved as ``jaxsys run --output`` saves), in
    ``folder``; and the index of its mesh cell, which must carry the mesh's picture."""
    path = folder / "quickstart.ipynb"
    shutil.copy(executed(NOTEBOOK_DIR / "00-quickstart.ipynb"), path)
    nb = nbformat.read(path, as_version=4)
    assert saved.widget_state_problems(nb) == []
    mesh = next(i for i, c in enumerate(nb.cells) if c.get("id") == "qs-08")
    assert any("image/png" in o.get("data", {}) for o in nb.cells[mesh].outputs)
    return path, mesh


def _quickstart_offline(path, tmp_path) -> None:
    """The saved quickstart's nbconvert page, offline: its mesh picture loads."""
    html_dir = tmp_path / "qs-html"
    r = subprocess.run(
        [sys.executable, "-m", "nbconvert", "--to", "html", str(path), "--output-dir", str(html_dir)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    with launch(width=1200, height=1400) as page:
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(
            ("file:", "data:")) else route.abort())  # fmt: skip
        page.goto((html_dir / "quickstart.html").as_uri())
        page.wait_for_load_state("load")
        sizes = page.evaluate(IMAGES, ".jp-OutputArea-output img")
    assert sizes and all(ok for _, _, ok in sizes), sizes


def test_saved_notebook_shows_its_pictures_offline_and_untrusted(tag, tmp_path):
    path = _run(tmp_path)
    _check_saved(nbformat.read(path, as_version=4))
    _nbconvert_offline(path, tmp_path)
    quickstart, mesh = _saved_quickstart(path.parent)
    _quickstart_offline(quickstart, tmp_path)
    extra = ["--JupyterNotebookApp.expose_app_in_browser=True"]
    with Lab(path.parent, work_dir=tmp_path / "lab", extra_args=extra) as lab:
        with launch(width=1400, height=1400) as page:
            try:
                _check_images(_open_untrusted(page, lab, "lab/tree/views.ipynb"), "Lab")
                screenshot(page, "saved-lab-untrusted.png")
                _check_images(_open_untrusted(page, lab, "notebooks/views.ipynb"), "Notebook 7")
                screenshot(page, "saved-notebook7-untrusted.png")
                # The saved quickstart, untrusted in Lab: its mesh cell shows the picture.
                # Lab draws only the cells in view: scroll to the mesh cell, then look.
                page.goto(lab.page_url("lab/tree/quickstart.ipynb"), timeout=120_000)
                wait_for(page, ".jp-NotebookPanel .jp-Cell", 120)
                page.evaluate(
                    "(i) => { const nb = window.jupyterapp.shell.currentWidget.content;"
                    " nb.activeCellIndex = i; nb.scrollToItem(i); }",
                    mesh,
                )
                # Cells are found through the notebook: Lab keeps only some in the page.
                page.wait_for_function(
                    "(i) => { const w = window.jupyterapp.shell.currentWidget.content.widgets[i];"
                    " const img = w && w.node.querySelector('.jp-OutputArea-output img');"
                    " return !!img && img.complete && img.naturalWidth > 0; }",
                    arg=mesh,
                    timeout=60_000,
                )
                screenshot(page, "saved-quickstart-lab-untrusted.png")
            except BaseException:
                screenshot(page, "saved-untrusted-failure.png")
                print(lab.log_tail())
                raise
    assert lab.killed == [], f"outlived the server's shutdown: {lab.killed}"
    assert wait_no_processes(tag, timeout=15) == []


def test_nbconvert_execute_with_no_flags_keeps_every_picture_offline(tag, tmp_path):
    # The ecosystem's own tool, as its users run it: nbclient stores the state of the widgets
    # a run made, and an exporter then writes a view as a CDN widget script instead of its
    # picture. jaxsys views are left out of that state, so the pictures stay.
    src = tmp_path / "views.ipynb"
    write_notebook(src, CELLS)
    html_dir = tmp_path / "html"
    r = subprocess.run(
        [sys.executable, "-m", "nbconvert", "--to", "html", "--execute", src.name,
         "--output-dir", str(html_dir)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    page_html = (html_dir / "views.html").read_text()
    assert "application/vnd.jupyter.widget-view+json" not in page_html
    with launch(width=1200, height=1400) as page:
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(
            ("file:", "data:")) else route.abort())  # fmt: skip
        page.goto((html_dir / "views.html").as_uri())
        page.wait_for_load_state("load")
        sizes = page.evaluate(IMAGES, ".jp-OutputArea-output img")
        screenshot(page, "nbconvert-execute-offline.png")
    _check_images(sizes, "nbconvert --execute")
