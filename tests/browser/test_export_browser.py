"""JupyterLab in headless chromium draws an export's artifact card and the cache view, from a
live 2-process cluster."""

from __future__ import annotations

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

REASON = available()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

CELLS = [
    "%jaxsys start --hosts 2 --devices-per-host 2 --cache-dir {cache_dir}",
    "%%multihost\n"
    "import jax, jax.numpy as jnp\n"
    "from jax import export\n"
    "from jax.sharding import AxisType, NamedSharding, PartitionSpec as P\n"
    "mesh = jax.make_mesh((4,), ('x',), axis_types=(AxisType.Auto,))\n"
    "b, = export.symbolic_shape('b', constraints=('b <= 64',))\n"
    "exp = export.export(jax.jit(lambda x: jnp.tanh(x) * 2))(\n"
    "    jax.ShapeDtypeStruct((4 * b, 8), jnp.float32, sharding=NamedSharding(mesh, P('x'))))\n"
    "exp",
    "%jaxsys cache",
    "%jaxsys stop",
]
CARD, CACHE = 1, 2


def _cell(page, index: int):
    return page.locator(".jp-NotebookPanel .jp-Cell").nth(index)


def test_artifact_card_and_cache_view_in_lab(tag, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    cells = [c.replace("{cache_dir}", str(tmp_path / "cache")) for c in CELLS]
    write_notebook(root / "card.ipynb", cells)
    with Lab(root, work_dir=tmp_path / "lab") as lab:
        with launch(width=1400, height=1200) as page:
            try:
                open_notebook(page, lab, "card.ipynb", timeout=120)
                for i in range(len(cells) - 1):
                    run_cell(page, i)
                wait_idle(page, 60)
                assert_no_errors(page)
                card = _cell(page, CARD).locator(".jxs-artifact")
                wait_for(page, ".jxs-artifact .jxs-art-sym", 30)
                text = card.first.inner_text()
                for fact in (
                    "Exported <lambda>",
                    "f32[4*b, 8]",
                    "b <= 64",
                    "mesh x=4",
                    "loads and runs here",
                    "accepts 9 to 10",
                ):
                    assert fact in text, (fact, text)
                assert card.first.locator(".jxs-art-sym").first.inner_text() == "b"
                screenshot(page, "artifact-card.png")
                view = _cell(page, CACHE).locator(".jxs-cache")
                wait_for(page, ".jxs-cache .jxs-table", 30)
                assert view.locator("tbody tr").count() == 3  # p0, p1 and the total
                why = view.locator(".jxs-cache-why").inner_text()
                assert why.startswith("p1: not served by the cache: on CPU"), why
                printed = "\n".join(_cell(page, CACHE).locator(OUTPUT).all_inner_texts())
                assert "p1: not served by the cache" in printed
                assert page.locator(".jxs-error").count() == 0
                run_cell(page, len(cells) - 1)
                wait_idle(page, 60)
            except BaseException:
                screenshot(page, "artifact-card-failure.png")
                print(lab.log_tail())
                raise
    assert not wait_no_processes(tag, timeout=30)
