"""`jaxsys job` without running a job: which cells a notebook's program keeps, and its
output collated per cell."""

from __future__ import annotations

import json
from pathlib import Path

from jaxsys_kernel import cli
from jaxsys_kernel.job import collate_outputs, from_notebook, render
from jaxsys_kernel.job.program import CELL_MARK, ERROR_MARK

REPO = Path(__file__).resolve().parents[2]


def _nb(tmp_path, *cells) -> Path:
    path = tmp_path / "nb.ipynb"
    nb = {
        "cells": [
            {"cell_type": "code", "source": src, "metadata": {"tags": tags}, "outputs": []}
            for src, tags in cells
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))
    return path


def test_the_quickstart_keeps_its_multihost_and_spmd_cells():
    prog = from_notebook(REPO / "notebooks" / "00-quickstart.ipynb")
    assert (prog.hosts, prog.devices_per_host) == (4, 2)
    kept = {c.index: c for c in prog.cells}
    assert kept[20].procs == [0]
    assert [c.index for c in prog.cells if c.expect_error] == [22]
    left = dict(prog.left_out)
    assert "%pull runs in the kernel only" in left.values()
    assert "%%local runs in the kernel only" in left.values()
    assert from_notebook(REPO / "notebooks" / "00-quickstart.ipynb", hosts=2).hosts == 2


def test_the_program_is_python_with_each_left_out_cell_named(tmp_path):
    path = _nb(
        tmp_path,
        ("%jaxsys start --hosts 3", []),
        ("%%multihost --procs 1-2\nprint('hi')", []),
        ("x = 1", []),
        ("%multihost on", []),
        ("y = 2", ["raises-exception"]),
    )
    prog = from_notebook(path)
    assert prog.hosts == 3
    assert [(c.index, c.procs, c.expect_error) for c in prog.cells] == [
        (1, [1, 2], False),
        (4, None, True),
    ]
    text = render(prog, "nb.ipynb")
    compile(text, "program.py", "exec")
    assert "# cell 2 left out: a kernel cell runs in the kernel only" in text
    assert text.index("# cell 2 left out") < text.index("(4, None, True")


def test_outputs_are_collated_per_cell_and_failures_named(tmp_path):
    path = _nb(tmp_path, ("%%multihost\nprint(1)", []), ("%%multihost\nboom()", []))
    prog = from_notebook(path, hosts=2)

    def out(rank, fails):
        text = f"{CELL_MARK}0\nsame\nrank {rank}\n{CELL_MARK}1\n"
        return text + (f"Traceback\nNameError: boom\n{ERROR_MARK}1\n" if fails else "")

    result = collate_outputs(prog, {0: out(0, False), 1: out(1, True)})
    assert result.failures == {1: [1]}
    assert result.log == (
        "--- cell 0 ---\n[p0-1] same\n[p0] rank 0\n[p1] rank 1\n"
        "--- cell 1 (failed on p1) ---\n[p1] Traceback\n[p1] NameError: boom\n"
    )


def test_jaxsys_job_writes_the_program_and_the_launchers_files(tmp_path, capsys):
    path = _nb(tmp_path, ("%%multihost\nprint(1)", []))
    for launcher, extra in (("local", None), ("slurm", "job.sbatch")):
        out = tmp_path / launcher
        code = cli.main(
            ["job", str(path), "--launcher", launcher, "--hosts", "2", "--out", str(out)]
        )
        assert code == 0
        assert (out / "program.py").is_file()
        if extra:
            text = (out / extra).read_text()
            assert "#SBATCH --ntasks=2" in text and "srun --kill-on-bad-exit=1" in text
    assert "run with:" in capsys.readouterr().out
    assert cli.main(["job", str(tmp_path / "missing.ipynb")]) == 2
