"""The notebook views: traits, dispatch, one comm message per update, valid front-end JS."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

from jaxsys_kernel.widgets import views as views_module
from jaxsys_kernel.widgets.esm import view_module

STATIC = pathlib.Path(views_module.__file__).parent / "static"


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_js_is_valid_module(tmp_path):
    for js in STATIC.glob("*.js"):
        copy = tmp_path / (js.stem + ".mjs")
        copy.write_text(js.read_text())
        proc = subprocess.run(["node", "--check", str(copy)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_each_view_module_with_shared_inlined_is_valid(tmp_path):
    for name in ("mesh", "sharding", "cache", "live"):
        copy = tmp_path / f"{name}.mjs"
        copy.write_text(view_module(name))
        proc = subprocess.run(["node", "--check", str(copy)], capture_output=True, text=True)
        assert proc.returncode == 0, (name, proc.stderr)


def test_widgets_never_import_jax():
    code = (
        "import sys\n"
        "import jaxsys_kernel.widgets as w\n"
        "w.Dashboard()\n"
        "assert 'jax' not in sys.modules, 'jax imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

