"""``jupyter console``: a progress bar is one line that carriage returns redraw, ending at its
final state, not a first frame left standing (the console ignores display updates), whether
the console started the kernel or attached to a running one with ``--existing``."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from jaxsys_kernel.cluster.front_end import attached_processes, client_sockets, command_of

from ..harness import Kernel

CONSOLE = Path(sys.executable).parent / "jupyter-console"
BAR = "engines registered"


@pytest.mark.skipif(not CONSOLE.exists(), reason="jupyter-console is not installed")
def test_jupyter_console_draws_a_progress_bar_as_one_updating_line(tag, tmp_path):
    cells = "%jaxsys start --hosts 2 --devices-per-host 1\n%jaxsys stop\n"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path))
    env.pop("JAXSYS_PROGRESS", None)
    r = subprocess.run(
        [str(CONSOLE), "--kernel", "jaxsys", "--simple-prompt", "--no-confirm-exit"],
        input=cells.encode(),
        capture_output=True,
        env=env,
        timeout=300,
    )
    assert_one_updating_line(r)


def assert_one_updating_line(r: subprocess.CompletedProcess) -> None:
    """The console printed the start's progress bar as one line ending at 2/2."""
    # Bytes, decoded by hand: text mode would turn every carriage return into a line break.
    out = r.stdout.decode(errors="replace")
    assert "processes x 1 devices ready" in out, out + r.stderr.decode(errors="replace")
    # The bar's line: every frame after a carriage return, the last one complete.
    line = next(ln for ln in out.split("\n") if BAR in ln)
    frames = [f for f in line.split("\r") if BAR in f]
    assert re.search(rf"{BAR} 2/2 \[", frames[-1]), frames
    # No frame stands on a line of its own before the bar's end.
    assert sum(BAR in ln for ln in out.split("\n")) == 1, out


@pytest.mark.skipif(not CONSOLE.exists(), reason="jupyter-console is not installed")
def test_a_console_attached_with_existing_gets_the_one_line_bar_too(tag, tmp_path, monkeypatch):
    # The kernel is started as a notebook server starts it (its parent is not a console);
    # the console attaches to it afterwards.
    monkeypatch.delenv("JAXSYS_PROGRESS", raising=False)
    kernel = Kernel(tag)
    try:
        cells = "%jaxsys start --hosts 2 --devices-per-host 1\n%jaxsys stop\n"
        r = subprocess.run(
            [str(CONSOLE), "--existing", kernel.km.connection_file, "--simple-prompt",
             "--no-confirm-exit"],
            input=cells.encode(),
            capture_output=True,
            env=dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path)),
            timeout=300,
        )  # fmt: skip
        assert_one_updating_line(r)
        # The console left; the kernel runs on for the front end that started it.
        assert kernel.ok("print('still here')").stdout.strip() == "still here"
    finally:
        kernel.shutdown()


def test_a_process_connected_to_a_port_is_found_by_its_socket():
    # A stand-in for `jupyter console --existing`: a process whose command line names the
    # console and that holds a TCP connection to the "kernel's" port.
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    code = (
        f"import socket, sys; s = socket.create_connection(('127.0.0.1', {port})); sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, "jupyter-console", "--existing"], stdin=subprocess.PIPE
    )
    try:
        server.settimeout(30)
        conn, _ = server.accept()
        assert client_sockets({port}), "the connection is not in /proc/net/tcp"
        assert attached_processes({port}) == [child.pid]
        assert "jupyter-console" in command_of(child.pid)
        # Only the client's side counts: this process, which accepted, is not listed.
        conn.close()
    finally:
        child.stdin.close()
        child.wait(timeout=30)
        server.close()
