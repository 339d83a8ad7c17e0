"""`jaxsys job` without running a job: which cells a notebook's program keeps, and its
output collated per cell."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import sys
import types
from pathlib import Path

from jaxsys_kernel import cli
from jaxsys_kernel.job import collate_outputs, from_notebook, render
from jaxsys_kernel.job.program import CELL_MARK, ERROR_MARK, STOP_MARK

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
    # The cell that runs on process 0 only, and the one expected to fail, by their text.
    (only_p0,) = [c for c in prog.cells if c.procs is not None]
    assert only_p0.procs == [0] and "only process" in only_p0.source
    (failing,) = [c for c in prog.cells if c.expect_error]
    assert "1 / scale" in failing.source
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
    # gloo's line of each device, written by two threads into each other, is no output.
    gloo = "is connected to 7 peer ranks. Expected number of connected peer ranks is : 7"
    tangled = f"{CELL_MARK}0\nsame\n[Gloo] Rank [Gloo] Rank 1 {gloo}\n0 {gloo}\n"
    assert collate_outputs(prog, {0: tangled, 1: f"{CELL_MARK}0\nsame\n"}).log == (
        "--- cell 0 ---\n[p0-1] same\n--- cell 1 (not reached on p0-1) ---\n"
    )
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


class _FakeConfig:
    """JAX's options as the program reads them, from the environment it set; updates are
    printed."""

    FLAGS = ("jax_distributed_verify_secure_credentials", "jax_enable_recoverability")

    def __getattr__(self, name):
        value = os.environ.get(name.upper(), "")
        return bool(value) if name in self.FLAGS else value

    def update(self, name, value):
        print("config", name, value)


def _run_program(monkeypatch, capsys, text: str, file: str = "program.py", **env) -> str:
    """Run a generated program (as if it were ``file``) here, on a stand-in for JAX that
    prints what it is asked."""
    fake = types.ModuleType("jax")
    private = types.ModuleType("jax._src")
    private.distributed = types.SimpleNamespace(global_state=types.SimpleNamespace(client=None))
    monkeypatch.setitem(sys.modules, "jax._src", private)
    fake.config = _FakeConfig()
    fake.distributed = types.SimpleNamespace(
        initialize=lambda **kwargs: print("initialize", sorted(kwargs))
    )
    fake.process_index, fake.process_count = (lambda: 0), (lambda: 1)

    def thread_guard(on):
        print("thread_guard", on)
        return contextlib.nullcontext()

    fake.thread_guard = thread_guard
    monkeypatch.setitem(sys.modules, "jax", fake)
    monkeypatch.setattr(os, "environ", {"PATH": os.environ["PATH"], **env})
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    capsys.readouterr()
    exec(compile(text, file, "exec"), {"__name__": "__main__", "__file__": file})
    return capsys.readouterr().out.replace(CELL_MARK, "cell ")


def test_the_notebooks_guards_are_set_before_the_cells_they_cover(tmp_path, monkeypatch, capsys):
    path = _nb(
        tmp_path,
        ("%jaxsys start --hosts 2 --thread-guard", []),
        ("%%multihost\nprint('before')", []),
        ("%jaxsys transfer-guard disallow", []),
        ("%%multihost\nprint('guarded')", []),
        ("%jaxsys transfer-guard", []),  # only shows the guard
        ("%jaxsys transfer-guard --h2d log", []),
        ("%%multihost\nprint('logged')", []),
    )
    prog = from_notebook(path)
    assert prog.thread_guard
    directions = ("host_to_device", "device_to_host", "device_to_device")
    assert prog.settings == [
        (2, {f"jax_transfer_guard_{d}": "disallow" for d in directions}),
        (5, {"jax_transfer_guard_host_to_device": "log"}),
    ]
    left = dict(prog.left_out)
    assert "sets its JAX options" in left[2] and left[4] == "%jaxsys runs in the kernel only"
    out = _run_program(monkeypatch, capsys, render(prog, "nb.ipynb"), JAXSYS_PROCESS_ID="0")
    lines = [line for line in out.splitlines() if not line.startswith("jaxsys job:")]
    assert lines == [
        "config jax_cpu_collectives_implementation gloo",
        "initialize ['heartbeat_timeout_seconds', 'initialization_timeout']",
        "thread_guard True",
        "cell 1",
        "before",
        *(f"config jax_transfer_guard_{d} disallow" for d in directions),
        "cell 3",
        "guarded",
        "config jax_transfer_guard_host_to_device log",
        "cell 6",
        "logged",
    ]


def test_a_transfer_guard_line_the_magic_refuses_is_named(tmp_path, capsys):
    path = _nb(tmp_path, ("%jaxsys transfer-guard sometimes", []))
    assert cli.main(["job", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "cell 0's %jaxsys transfer-guard line" in err and "sometimes" in err


def test_each_process_gets_the_clusters_setup_and_its_own_certificate(
    tmp_path, monkeypatch, capsys
):
    path = _nb(tmp_path, ("%jaxsys start --hosts 2 --heartbeat 7 --cache-dir /tmp/cc", []))
    out = tmp_path / "out"
    assert cli.main(["job", str(path), "--out", str(out)]) == 0
    for rank in (0, 1):
        key = out / "pki" / f"process-{rank}.key"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    # The processes need the CA's certificate, not its key; the program names no path of
    # this machine, and finds the job's files in its own folder wherever that is.
    assert sorted(p.name for p in (out / "pki").iterdir()) == [
        "ca.pem", "process-0.key", "process-0.pem", "process-1.key", "process-1.pem"
    ]  # fmt: skip
    text = (out / "program.py").read_text()
    assert "heartbeat_timeout_seconds=7," in text
    assert str(tmp_path) not in text
    moved = tmp_path / "moved"
    out.rename(moved)
    out = moved
    text = (out / "program.py").read_text()
    printed = _run_program(
        monkeypatch, capsys, text, file=str(out / "program.py"), JAXSYS_PROCESS_ID="1"
    )
    said = next(line for line in printed.splitlines() if line.startswith("jaxsys job:"))
    assert said == (
        f"jaxsys job: process 0 of 1: jax_mtls_cert_file={out}/pki/process-1.pem "
        "jax_distributed_verify_secure_credentials=True jax_compilation_cache_dir=/tmp/cc "
        "jax_enable_recoverability=True"
    )
    # Without mTLS: no certificates, and none asked for.
    assert cli.main(["job", str(path), "--out", str(tmp_path / "plain"), "--insecure"]) == 0
    assert not (tmp_path / "plain" / "pki").exists()
    assert "\nPROCESS_ENV = {}\n" in (tmp_path / "plain" / "program.py").read_text()


def test_a_process_after_a_failed_cell_runs_nothing_more_and_the_log_says_so(tmp_path):
    path = _nb(
        tmp_path,
        ("%%multihost\nraise ValueError('p1 fails')", []),
        ("%%multihost\nprint('never' + 'reached')", []),
    )
    prog = from_notebook(path, hosts=2)
    outputs = {
        0: f"{CELL_MARK}0\n{STOP_MARK}0 failed on p1\n",
        1: f"{CELL_MARK}0\nValueError: p1 fails\n{ERROR_MARK}0\n",
    }
    result = collate_outputs(prog, outputs)
    assert result.failures == {0: [1]}
    assert result.log == (
        "--- cell 0 (failed on p1) ---\n[p1] ValueError: p1 fails\n"
        "--- cell 1 (not run: the job stopped at cell 0) ---\n"
    )



def test_a_line_break_in_a_scheduler_option_is_refused_in_words(tmp_path, capsys):
    path = _nb(tmp_path, ("%%multihost\nprint(1)", []))
    for flag in ("--partition", "--time", "--account", "--sbatch-arg"):
        out = tmp_path / flag.strip("-")
        argv = ["job", str(path), "--launcher", "slurm", "--out", str(out)]
        assert cli.main([*argv, f"{flag}=debug\ntouch PWNED"]) == 2
        err = capsys.readouterr().err
        assert flag in err and "line break" in err and "one line" in err, err
        assert not (out / "job.sbatch").exists()
