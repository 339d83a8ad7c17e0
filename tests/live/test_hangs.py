"""The hang doctor on a real 2-process cluster: failures before collectives, divergent
branches, timeouts, and the out-of-step world afterwards."""

from __future__ import annotations

import time

import pytest

from ..harness import kernel_with_cluster

FAIL_BEFORE_COLLECTIVE = """%%multihost --grace 2 {opts}
import jax, numpy as np
from jax.experimental import multihost_utils
if jax.process_index() == 1:
    raise ValueError('p1 fails before the collective')
multihost_utils.process_allgather(np.ones(3))
"""


@pytest.fixture(scope="module")
def k(tag):
    with kernel_with_cluster(tag, "%jaxsys start --hosts 2 --devices-per-host 1") as kernel:
        yield kernel


def test_failure_before_a_collective_is_diagnosed_and_interrupted(k):
    t0 = time.monotonic()
    out = k.execute(FAIL_BEFORE_COLLECTIVE.format(opts=""))
    took = time.monotonic() - t0
    assert out.status == "error" and out.error["ename"] == "MultihostHang"
    assert "ValueError on p1" in out.error["evalue"] and "p0 kept running" in out.error["evalue"]
    assert took < 2 + 8  # grace + stack dump + interrupt grace
    report = out.stderr
    assert "jaxsys hang doctor: p1 failed and p0 kept running for 2 s more" in report
    assert "p1: raised ValueError: p1 fails before the collective" in report
    assert "p0: still running" in report
    assert "** " in report and "multihost_utils.py" in report  # waiting inside the collective
    assert ">> " in report  # and the user's own line that called it
    assert "jaxsys: interrupting p0" in report


def test_out_of_step_world_refuses_cells_until_restart(k):
    out = k.execute("%%multihost\nprint('hi')")
    assert out.status == "error" and out.error["ename"] == "UsageError"
    assert "out of step" in out.error["evalue"] and "%jaxsys restart" in out.error["evalue"]
    out = k.ok("%jaxsys restart")
    assert "ready again" in out.stdout
    assert k.ok("%%multihost\nprint('hi')").stdout == "[p0-1] hi\n"


def test_divergent_branch_is_named(k):
    out = k.execute(
        "%%multihost --grace 2\n"
        "import jax, numpy as np\n"
        "from jax.experimental import multihost_utils\n"
        "if jax.process_index() == 0:\n"
        "    multihost_utils.process_allgather(np.ones(3))\n"
    )
    assert out.status == "error" and out.error["ename"] == "MultihostHang"
    assert (
        "p0 waited inside JAX" in out.error["evalue"] and "different paths" in out.error["evalue"]
    )
    assert "p1 finished, but p0 still wait inside JAX" in out.stderr
    k.ok("%jaxsys restart")


def test_extra_work_on_one_process_is_not_a_hang(k):
    out = k.ok(
        "%%multihost --grace 1\nimport time, jax\nif jax.process_index() == 0:\n    time.sleep(2.5)\nprint('done')"
    )
    assert "hang doctor" not in out.stderr
    assert "done" in out.stdout


def test_timeout_reports_stacks(k):
    out = k.execute("%%multihost --timeout 1.5\nimport time\ntime.sleep(30)")
    assert out.status == "error" and out.error["ename"] == "MultihostTimeout"
    assert "passed its timeout of 1.5 s" in out.stderr
    assert ">> " in out.stderr  # time.sleep in the user's cell
    # Interrupted outside JAX: the world is still fine.
    assert k.ok("%%multihost\nprint('fine')").stdout == "[p0-1] fine\n"


def test_on_hang_restart_restarts_the_world(k):
    pids = k.ok("%%multihost\nimport os\nos.getpid()").text
    out = k.execute(FAIL_BEFORE_COLLECTIVE.format(opts="--on-hang restart"))
    assert out.status == "error" and "stopped by a world restart" in out.error["evalue"]
    assert "JAX world restarted in" in out.stdout
    assert k.ok("%%multihost\nimport os\nos.getpid()").text != pids
    assert k.ok("%%multihost\nimport jax\nprint(jax.device_count())").stdout == "[p0-1] 2\n"


def test_same_program_guard_names_processes_out_of_step(k):
    k.ok("%%multihost --procs 0\nx_only_here = 1")
    out = k.ok("%%multihost\nprint('together')")
    assert "Warning: these processes are out of step: p0 ran 1 cell(s)" in out.stderr
    assert "p1 ran 0 cell(s)" in out.stderr
    # After a cell on every process they are in step again.
    assert "out of step" not in k.ok("%%multihost\nprint('again')").stderr
