"""`jaxsys job --submit` for real: the quickstart notebook as one job of four local
processes, each joined with mTLS and the compilation cache a notebook's cluster has, its
output collated as the notebook shows it, and a failing cell that stops every process and
names itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from jaxsys_kernel.cluster import ClusterConfig
from jaxsys_kernel.job import owner

REPO = Path(__file__).resolve().parents[2]


def _job(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jaxsys_kernel.cli", "job", *args, "--submit"],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def test_the_quickstart_runs_as_a_job(tmp_path):
    r = _job("notebooks/00-quickstart.ipynb", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr + r.stdout
    log = (tmp_path / "job.log").read_text()
    assert log in r.stdout
    for expected in (
        "--- cell 8 ---\n[p0] I am process 0 of 4\n",
        "[p0-3] local devices: 2, devices in the world: 8\n",
        "[p0-3] sum: 48.0 mean: 1.5\n",
        "--- cell 22 ---\n[p0] only process 0 ran this",
        "--- cell 24 (failed on p1,3, as expected) ---\n",
        "[p1,3] ZeroDivisionError: division by zero\n",
        "[p0] 0\n[p1] 10\n[p2] 20\n[p3] 30\n",
    ):
        assert expected in log, log
    assert "program.py" not in log  # tracebacks start at the cell's own frames
    assert "Gloo" not in log
    # Each process joined with its own certificate, refusing an insecure channel, and used
    # the cache directory a notebook's cluster would (what it says before its first cell).
    cache = ClusterConfig().cache_dir
    for rank in range(4):
        said = (tmp_path / f"p{rank}.out").read_text()
        assert (
            f"jaxsys job: process {rank} of 4: jax_mtls_cert_file={tmp_path}/pki/process-{rank}.pem "
            f"jax_distributed_verify_secure_credentials=True jax_compilation_cache_dir={cache} "
            "jax_enable_recoverability=True"
        ) in said, said
    assert "jaxsys job: process" not in log


def test_a_failing_cell_stops_every_process_and_is_named(tmp_path):
    cells = [
        "%jaxsys start --hosts 2 --devices-per-host 1",
        "%%multihost\nimport jax, numpy as np\nfrom jax.experimental import multihost_utils",
        "%%multihost\nif jax.process_index() == 1:\n    raise ValueError('p1 fails')\n"
        "multihost_utils.process_allgather(np.ones(3))",
        "%%multihost\nprint('never')",
    ]
    nb = {
        "cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": []} for c in cells],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path = tmp_path / "fails.ipynb"
    path.write_text(json.dumps(nb))
    t0 = time.monotonic()
    r = _job(str(path), "--out", str(tmp_path / "out"), timeout=120)
    took = time.monotonic() - t0
    assert r.returncode != 0
    assert "jaxsys job: cell 2 failed on p1" in r.stderr
    log = (tmp_path / "out" / "job.log").read_text()
    assert "--- cell 2 (failed on p1) ---" in log and "[p1] ValueError: p1 fails" in log
    assert "never" not in log
    # p0 waited in the collective for p1 and was stopped, not left hanging.
    assert took < 60


def _notebook(path: Path, *cells: str) -> Path:
    nb = {
        "cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": []} for c in cells],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))
    return path


START = "%jaxsys start --hosts 2 --devices-per-host 1"
NEVER = "%%multihost\nprint('never' + 'reached')"


@pytest.mark.parametrize("rank", [1, 0])
def test_no_process_runs_the_cell_after_one_failed_on_another(tmp_path, rank):
    # Cell 1 fails on one process alone; the other, which finished it, must not go on to
    # cell 2 (also when the one that failed is process 0, which serves the coordination).
    fails = f"%%multihost\nimport jax\nif jax.process_index() == {rank}:\n    raise ValueError()"
    path = _notebook(tmp_path / "fails.ipynb", START, fails, NEVER)
    r = _job(str(path), "--launcher", "local", "--out", str(tmp_path / "out"), timeout=120)
    assert r.returncode != 0
    assert f"jaxsys job: cell 1 failed on p{rank}" in r.stderr
    log = (tmp_path / "out" / "job.log").read_text()
    assert "neverreached" not in log + _read(tmp_path / "out" / f"p{1 - rank}.out")
    assert "--- cell 2 (not run: the job stopped at cell 1) ---\n" in log, log
    assert log.endswith(f"jaxsys job: ended: cell 1 failed on p{rank}\n"), log


def test_a_process_killed_in_a_cell_ends_the_job_there(tmp_path):
    dies = (
        "%%multihost\nimport jax, os, signal\n"
        "if jax.process_index() == 1:\n    os.kill(os.getpid(), signal.SIGKILL)"
    )
    path = _notebook(tmp_path / "dies.ipynb", START, dies, NEVER)
    t0 = time.monotonic()
    r = _job(str(path), "--out", str(tmp_path / "out"), timeout=120)
    assert r.returncode != 0
    log = (tmp_path / "out" / "job.log").read_text()
    assert "neverreached" not in log
    assert log.endswith("jaxsys job: ended: p1 died of SIGKILL in cell 1\n"), log
    assert time.monotonic() - t0 < 60


def _left(marker: str) -> list[psutil.Process]:
    """The processes (zombies aside) whose environment carries ``marker``."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(MARK) == marker:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def _none_left(marker: str, within: float = 5.0) -> list[psutil.Process]:
    deadline = time.monotonic() + within
    while (left := _left(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


MARK = "JAXSYS_TEST_JOB_MARK"
# Every process of the job starts a process of its own, then sleeps.
SLEEPS = (
    "%%multihost\nimport subprocess, time\nsubprocess.Popen(['sleep', '600'])\n"
    "print('sleeping', flush=True)\ntime.sleep(600)"
)


def _marked_job(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, str]:
    marker = f"job-{time.monotonic_ns()}"
    path = _notebook(tmp_path / "sleeps.ipynb", START, SLEEPS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxsys_kernel.cli", "job", str(path), "--submit", *args],
        cwd=REPO,
        env={**os.environ, MARK: marker},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, marker


def test_the_timeout_ends_every_process_of_the_job(tmp_path):
    out = tmp_path / "out"
    proc, marker = _marked_job(tmp_path, "--out", str(out), "--timeout", "5")
    try:
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 124, stderr
    assert "Traceback" not in stderr
    assert _none_left(marker) == []
    assert (out / "job.log").read_text().endswith("jaxsys job: ended: timeout after 5 s\n")


@pytest.mark.parametrize(
    ("signum", "code", "why"),
    [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted (SIGINT)")],
)
def test_a_signal_to_jaxsys_job_ends_every_process_of_the_job(tmp_path, signum, code, why):
    # SIGINT is what Ctrl-C sends: the job's processes, in sessions of their own, get none.
    out = tmp_path / "out"
    proc, marker = _marked_job(tmp_path, "--out", str(out))
    try:
        # Once every process is in the cell, and has started its own process.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
            "sleeping" in _read(out / f"p{r}.out") for r in (0, 1)
        ):
            time.sleep(0.1)
        assert len(_left(marker)) >= 5  # jaxsys job, its runner, 2 processes, 2 sleeps
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr
    assert _none_left(marker) == []
    log = (out / "job.log").read_text()
    assert "[p0-1] sleeping\n" in log and log.endswith(f"jaxsys job: ended: {why}\n"), log


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_a_job_folder_moved_elsewhere_runs_there(tmp_path):
    cells = (START, "%%multihost\nimport jax\nprint('process', jax.process_index())")
    path = _notebook(tmp_path / "moves.ipynb", *cells)
    r = subprocess.run(
        [sys.executable, "-m", "jaxsys_kernel.cli", "job", str(path), "--out", str(tmp_path / "a")],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    moved = tmp_path / "elsewhere" / "b"
    moved.parent.mkdir()
    (tmp_path / "a").rename(moved)
    command = [sys.executable, "-m", "jaxsys_kernel.job.local", "program.py", "2", "."]
    run = subprocess.run(command, cwd=moved, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr + _read(moved / "p0.out") + _read(moved / "p1.out")
    for rank in (0, 1):
        said = _read(moved / f"p{rank}.out")
        assert f"process {rank}\n" in said and f"{moved}/pki/process-{rank}.pem" in said, said


def test_a_jobs_command_stopped_by_its_timeout_leaves_nothing(tmp_path):
    # A runner that does not end by itself: SIGTERM to its session ends it and what it
    # started, and a scheduler's job that cannot be cancelled is named.
    code = (
        "import subprocess, time; p = subprocess.Popen(['sleep', '60']); "
        "open('sleep.pid', 'w').write(str(p.pid)); time.sleep(60)"
    )
    start = time.monotonic()
    ended = owner.run_owned([sys.executable, "-c", code], tmp_path, 2.0, cancel=["false"])
    assert ended.code == 124 and time.monotonic() - start < owner.END_WAIT_S
    assert ended.stopped == "timeout after 2 s; false failed (): cancel the job by hand"
    sleeper = int((tmp_path / "sleep.pid").read_text())
    deadline = time.monotonic() + 5
    while _alive(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(sleeper)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_jobs_command_runs_without_a_surrounding_slurm_jobs_variables(tmp_path, monkeypatch):
    # Inside a Lab's Slurm job (batchspawner, Open OnDemand), SLURM_EXPORT_ENV=NONE would
    # make sbatch/srun drop every variable the processes need.
    monkeypatch.setenv("SLURM_EXPORT_ENV", "NONE")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "2")
    monkeypatch.setenv("JAXSYS_TEST_KEPT", "yes")
    code = "import json, os; json.dump(dict(os.environ), open('env.json', 'w'))"
    ended = owner.run_owned([sys.executable, "-c", code], tmp_path, 30.0)
    assert ended.code == 0
    seen = json.loads((tmp_path / "env.json").read_text())
    assert "SLURM_EXPORT_ENV" not in seen and "SLURM_CPUS_PER_TASK" not in seen
    assert seen["JAXSYS_TEST_KEPT"] == "yes"


def test_the_coordinators_port_is_held_while_a_local_jobs_processes_run(tmp_path):
    # Process 0 checks what the runner gave it: a plain bind (anyone else) is refused, a
    # bind with SO_REUSEPORT (JAX's coordination service, through gRPC) is not.
    program = tmp_path / "program.py"
    program.write_text(
        "import os, socket, sys\n"
        "host, port = os.environ['JAXSYS_COORDINATOR'].rsplit(':', 1)\n"
        "plain = socket.socket()\n"
        "try:\n"
        "    plain.bind((host, int(port)))\n"
        "    sys.exit('the port was free for anyone')\n"
        "except OSError:\n"
        "    pass\n"
        "s = socket.socket()\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
        "s.bind((host, int(port)))\n"
        "s.listen()\n"
    )
    # The runner as a job's command runs it (in a process of its own, as JAX is not here).
    command = [sys.executable, "-m", "jaxsys_kernel.job.local", "program.py", "1", "."]
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr + _read(tmp_path / "p0.out")
