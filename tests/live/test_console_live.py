"""``jupyter console``: a progress bar is one line that carriage returns redraw, ending at its
final state, not a first frame left standing (the console ignores display updates)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
    # Bytes, decoded by hand: text mode would turn every carriage return into a line break.
    out = r.stdout.decode(errors="replace")
    assert "processes x 1 devices ready" in out, out + r.stderr.decode(errors="replace")
    # The bar's line: every frame after a carriage return, the last one complete.
    line = next(ln for ln in out.split("\n") if BAR in ln)
    frames = [f for f in line.split("\r") if BAR in f]
    assert re.search(rf"{BAR} 2/2 \[", frames[-1]), frames
    # No frame stands on a line of its own before the bar's end.
    assert sum(BAR in ln for ln in out.split("\n")) == 1, out
