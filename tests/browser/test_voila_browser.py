"""A Voilà dashboard's cluster does not outlive its page.

``voila NB.ipynb`` (as README serves it) with a 2 x 1 cluster, opened in headless chromium:
the page shows the processes' output, and while it stays open its cluster stays; once the
page is closed, the kernel and every process of its cluster are gone within 2 minutes (Voilà's own shutdown beacon is refused by its
server, so the kernel ends itself: jaxsys_kernel/kernel/page.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from jaxsys_kernel.kernel import page as page_watch

from ..browser import _free_port, available, launch
from ..harness import TAG_VAR, tagged_processes, wait_no_processes, write_notebook

REASON = available() or (
    None if shutil.which("voila", path=str(Path(sys.executable).parent)) else "voila missing"
)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

VOILA = Path(sys.executable).with_name("voila")
CELLS = [
    "%jaxsys start --hosts 2 --devices-per-host 1",
    "%%multihost\nimport jax\nprint('dashboard of process', jax.process_index())",
]
# What the page may take: the kernel starts, then the cluster, then both cells run.
LOAD_S = 180.0
# The promise: none of the page's processes is left 2 minutes after it closed.
GONE_S = 120.0
# A closed page's grace, shorter than the default's 20 s (the same rule, sooner).
PAGE_GRACE_S, PAGE_POLL_S = 5.0, page_watch.POLL_S


def _wait_serving(url: str, server: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "voila/static/", timeout=5):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def _page_processes(tag: str, server: int) -> list[psutil.Process]:
    return [p for p in tagged_processes(tag) if p.pid != server]


def test_closing_the_page_ends_its_kernel_and_cluster(tag, tmp_path):
    nb = tmp_path / "dash.ipynb"
    write_notebook(nb, CELLS)
    port = _free_port()
    env = {**os.environ, TAG_VAR: tag, page_watch.IDLE_VARIABLE: f"{PAGE_GRACE_S:g}"}
    server = subprocess.Popen(
        [str(VOILA), str(nb), "--no-browser", f"--port={port}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "voila.log", "w"),  # noqa: SIM115 - closed with the process
    )
    try:
        url = f"http://localhost:{port}/"
        _wait_serving(url, server)
        with launch() as page:
            page.goto(url, timeout=LOAD_S * 1000)
            page.wait_for_function(
                "() => document.body.innerText.includes('dashboard of process 1')",
                timeout=LOAD_S * 1000,
            )
            text = page.inner_text("body")
            assert "[p0] dashboard of process 0" in text, text
            running = _page_processes(tag, server.pid)
            # The kernel, the controller and both engines at least.
            assert len(running) >= 4, [p.cmdline() for p in running]
            rss = 0
            for p in running:
                try:
                    rss += p.memory_info().rss
                except psutil.Error:
                    pass
            print(f"a visitor's page: {len(running)} processes, {rss / 2**20:.0f} MiB resident")
            # An open page keeps its cluster: held open longer than a closed page's grace,
            # every process is still there.
            page.wait_for_timeout((PAGE_GRACE_S + 3 * PAGE_POLL_S) * 1000)
            still = _page_processes(tag, server.pid)
            assert {p.pid for p in running} <= {p.pid for p in still}, "an open page lost processes"
            page.close(run_before_unload=True)
            closed = time.monotonic()
        deadline = closed + GONE_S
        left = _page_processes(tag, server.pid)
        while left and time.monotonic() < deadline:
            time.sleep(1.0)
            left = _page_processes(tag, server.pid)
        took = time.monotonic() - closed
        log = (tmp_path / "voila.log").read_text()[-3000:]
        assert not left, f"left after {took:.0f} s: {[p.cmdline() for p in left]}\n{log}"
        print(f"page's processes gone {took:.1f} s after it closed")
        assert server.poll() is None, "the Voilà server itself must keep serving"
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    assert not wait_no_processes(tag, timeout=20)
