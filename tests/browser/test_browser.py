"""JupyterLab in headless chromium runs a jaxsys notebook: kernel output, an anywidget,
and a cell on a two-process cluster all show up in the page."""

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
    run_all,
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

HELLO_WIDGET = '''\
import anywidget
import traitlets


class Hello(anywidget.AnyWidget):
    _esm = """export default { render({ model, el }) {
        el.innerHTML = `<div class='jx-hello'>${model.get('value')}</div>`; } }"""
    value = traitlets.Unicode('rendered by anywidget').tag(sync=True)


Hello()
'''

CELLS = [
    "print('hello from the kernel')",
    HELLO_WIDGET,
    "%jaxsys start --hosts 2 --devices-per-host 1",
    "%%multihost\nimport jax\nprint('devices', jax.device_count())",
]


def test_lab_runs_kernel_widget_and_cluster(tag, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    write_notebook(root / "smoke.ipynb", CELLS)
    t0 = time.monotonic()
    with Lab(root, work_dir=tmp_path / "lab") as lab:
        assert "jaxsys" in lab.kernelspecs(), lab.log_tail()
        with launch() as page:
            try:
                open_notebook(page, lab, "smoke.ipynb", timeout=120)
                run_all(page)
                wait_for(page, f"{OUTPUT}:has-text('hello from the kernel')", 60)
                hello = wait_for(page, ".jx-hello", 60)
                assert hello.inner_text() == "rendered by anywidget"
                wait_for(page, f"{OUTPUT}:has-text('[p0-1] devices 2')", 240)
                wait_idle(page, 60)
                assert_no_errors(page)
                screenshot(page, "browser-smoke.png")
            except BaseException:
                screenshot(page, "browser-smoke-failure.png")
                print(lab.log_tail())
                raise
        assert len(lab.kernels()) == 1
    assert lab.killed == [], f"outlived the server's shutdown: {lab.killed}"
    assert wait_no_processes(tag, timeout=15) == []
    print(f"browser smoke test: {time.monotonic() - t0:.1f} s")
