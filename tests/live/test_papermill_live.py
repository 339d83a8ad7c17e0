"""papermill's parameters reach every process, run with the real ``papermill`` command.

The notebook has a plain cell tagged ``parameters`` (as papermill documents it), then starts
a 2 x 1 cluster and uses the parameter in a ``%%multihost`` cell; ``-p steps 3`` must reach
both processes, and no process may be left once papermill has exited.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from ..harness import TAG_VAR, wait_no_processes

pytestmark = pytest.mark.slow

PAPERMILL = Path(sys.executable).with_name("papermill")


def _notebook(path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "jaxsys", "display_name": "jaxsys", "language": "python"}
    params = nbformat.v4.new_code_cell("steps = 1")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [
        params,
        nbformat.v4.new_code_cell("%jaxsys start --hosts 2 --devices-per-host 1"),
        nbformat.v4.new_code_cell(
            "%%multihost\nimport jax\nprint('steps', steps, 'on', jax.process_index())"
        ),
        nbformat.v4.new_code_cell("%jaxsys stop"),
    ]
    nbformat.write(nb, path)


def _stdout(nb, index: int) -> str:
    return "".join(o.get("text", "") for o in nb.cells[index].outputs if o.output_type == "stream")


def test_papermill_parameters_reach_every_process(tag, tmp_path):
    source, result = tmp_path / "params.ipynb", tmp_path / "out.ipynb"
    _notebook(source)
    env = {**os.environ, TAG_VAR: tag}
    done = subprocess.run(
        [str(PAPERMILL), str(source), str(result), "-k", "jaxsys", "-p", "steps", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    nb = nbformat.read(result, as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "steps = 3" in injected[0].source
    multihost = next(i for i, c in enumerate(nb.cells) if c.source.startswith("%%multihost"))
    out = _stdout(nb, multihost)
    assert "[p0] steps 3 on 0" in out and "[p1] steps 3 on 1" in out, json.dumps(
        nb.cells[multihost].outputs
    )
    assert not wait_no_processes(tag, timeout=20)
