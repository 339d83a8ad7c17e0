"""The course site, built from the notebook test's executed copies, opened in chromium.

Every notebook is executed once per session (``tests/executed.py``: the notebook test in
tests/live reuses these copies, or made them first), rendered by Sphinx with myst-nb with
execution off (``docs/site/build.py``), and each page is opened from disk with every other
request refused. A page must show every output its run produced, the error of each cell
tagged ``raises-exception``, and the views' static pictures; no view may be left as a widget
placeholder that needs a kernel.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import nbformat
import pytest

from ..executed import executed
from ..unit.test_notebooks import NOTEBOOKS
from . import available, launch, screenshot

REASON = available()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

BUILD = Path(__file__).parents[2] / "docs" / "site" / "build.py"

# Pictures a page must show: the views' static renderings (PNG or inline SVG).
PICTURES = {
    "01-meshes-and-shardings": 8,
    "02-data-loading": 2,
    "06b-compilation-cache-dashboard": 2,
}
# Views whose static form is HTML text rather than a picture: a fragment each must show.
VIEW_TEXT = {"05-export-and-shape-polymorphism": "f32[4*b, 16]"}

# Per page: outputs, error outputs, pictures (img or svg inside outputs), widget placeholders.
COUNT = """() => {
  const outs = [...document.querySelectorAll('div.cell_output')];
  return {
    outputs: outs.length,
    errors: document.querySelectorAll('div.cell_output .output.traceback, div.cell_output pre.traceback').length,
    pictures: outs.reduce((n, o) => n + o.querySelectorAll('img, svg').length, 0),
    broken: [...document.querySelectorAll('div.cell_output img')].filter((i) => !(i.complete && i.naturalWidth > 0)).length,
    widgets: document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').length,
  };
}"""


def _builder():
    spec = importlib.util.spec_from_file_location("course_site_build", BUILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _expected(path: Path) -> tuple[int, int]:
    """Code cells with outputs, and cells whose run left an error, in an executed copy."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    with_output = sum(bool(c.get("outputs")) for c in code)
    errors = sum(any(o.output_type == "error" for o in c.outputs) for c in code)
    return with_output, errors


@pytest.fixture(scope="module")
def site(tag, tmp_path_factory):
    t0 = time.monotonic()
    copies = []
    for i, path in enumerate(NOTEBOOKS, 1):
        print(f"[{i}/{len(NOTEBOOKS)}] executed copy of {path.name}", flush=True)
        copies.append(executed(path))
    print(f"executed copies ready in {time.monotonic() - t0:.0f} s", flush=True)
    index = _builder().build_site(copies, tmp_path_factory.mktemp("site"))
    return index, copies


@pytest.mark.timeout(3600)
def test_every_page_shows_its_outputs_and_pictures(site):
    index, copies = site
    blocked: list[str] = []
    seen, texts = {}, {}
    with launch(width=1300, height=1000) as page:

        def only_files(route):
            if route.request.url.startswith(("file:", "data:")):
                route.continue_()
            else:
                blocked.append(route.request.url)
                route.abort()

        page.route("**/*", only_files)
        page.goto(index.as_uri())
        links = page.eval_on_selector_all(".toctree-wrapper a", "(as) => as.map((a) => a.href)")
        guides = _builder().GUIDES
        assert len(links) == len(copies) + len(guides), links
        for guide in guides:  # the troubleshooting page and the cheat sheet, after the notebooks
            page.goto((index.parent / f"{guide.stem}.html").as_uri())
            page.wait_for_load_state("load")
            title = guide.read_text().splitlines()[0].lstrip("# ")
            texts[guide.stem] = page.locator("body").inner_text()
            assert title in texts[guide.stem], guide.name
        for copy in copies:
            page.goto((index.parent / f"{copy.stem}.html").as_uri())
            page.wait_for_load_state("load")
            seen[copy.stem] = page.evaluate(COUNT)
            texts[copy.stem] = page.locator("body").inner_text()
            if copy.stem in ("01-meshes-and-shardings", "05b-shape-polymorphism"):
                screenshot(page, f"course-site-{copy.stem}.png")
    print(f"blocked {len(blocked)} requests to outside the site")
    for copy in copies:
        outputs, errors = _expected(copy)
        got = seen[copy.stem]
        print(copy.stem, got, f"(run: {outputs} cells with output, {errors} with an error)")
        assert got["outputs"] >= outputs, (copy.stem, got, outputs)
        assert got["errors"] >= errors, (copy.stem, got, errors)
        assert got["pictures"] >= PICTURES.get(copy.stem, 0), (copy.stem, got)
        assert got["broken"] == 0 and got["widgets"] == 0, (copy.stem, got)
        assert VIEW_TEXT.get(copy.stem, "") in texts[copy.stem], copy.stem
