"""What a user of a real jaxsys kernel sees: the kernel's state kept truthful while the
sidebar talks to it, progress on stdout, errors grouped with their values tabled and the
notebook's cell number, a hang's interrupts folded, and the cluster's state in one word."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid

import nbformat
import pytest

from jaxsys_kernel.kernel import comm as jcomm

from ..harness import Kernel

pytestmark = pytest.mark.slow

START = "%jaxsys start --hosts 2 --devices-per-host 1"
DIVERGE = (
    "%%multihost --timeout 4\n"
    "import jax, time\n"
    "from jax.experimental import multihost_utils\n"
    "if jax.process_index() == 0:\n"
    "    multihost_utils.sync_global_devices('only p0')\n"
    "else:\n"
    "    time.sleep(60)\n"
)


@pytest.fixture(scope="module")
def k(tag):
    kernel = Kernel(tag)
    try:
        yield kernel
    finally:
        kernel.shutdown()


def send_comm(k: Kernel, msg_type: str, comm_id: str, **content) -> str:
    msg = k.kc.session.msg(msg_type, {"comm_id": comm_id, **content})
    k.kc.shell_channel.send(msg)
    return msg["header"]["msg_id"]


def test_sidebar_traffic_during_a_cell_never_sets_the_kernels_status(k):
    comm_id = uuid.uuid4().hex
    send_comm(k, "comm_open", comm_id, target_name=jcomm.TARGET, data={})
    k.ok("1")  # the open is served before the next cell
    cell = k.kc.execute("import time; time.sleep(4)")
    deadline = time.monotonic() + 60
    refreshes, states_during, statuses = [], 0, []
    while time.monotonic() < deadline:
        if len(refreshes) < 3:
            refreshes.append(send_comm(k, "comm_msg", comm_id, data={"type": "refresh"}))
        msg = k.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        parent = msg["parent_header"].get("msg_id")
        if msg["msg_type"] == "status":
            statuses.append((parent, msg["content"]["execution_state"]))
            if parent == cell and msg["content"]["execution_state"] == "idle":
                break
        elif msg["msg_type"] == "comm_msg" and parent in refreshes:
            states_during += 1
    else:
        raise AssertionError(f"the cell did not end within 60 s; statuses: {statuses}")
    # The refreshes were answered while the cell ran, and said nothing of the kernel's state.
    assert states_during >= 1, "no state came back while the cell ran"
    assert [s for s in statuses if s[0] in refreshes] == [], statuses
    assert statuses[-1] == (cell, "idle")


def test_start_progress_and_ready_line_are_on_stdout(k):
    out = k.execute(START, timeout=180)
    assert out.status == "ok", out.stderr
    assert " ready in " in out.stdout and "processes initialised 2/2" in out.progress
    assert out.stderr == "", out.stderr


def test_errors_differing_in_a_value_show_one_traceback_and_a_table(k):
    code = (
        "%%multihost\nimport jax\n"
        "raise ValueError(f'bad shard on device {6144 * (jax.process_index() + 1)}')"
    )
    out = k.execute(code)
    assert out.status == "error"
    text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out.error["traceback"]))
    assert "[p0-1] ValueError: bad shard on device <device>" in text, text
    assert "device: 6144 on p0, 12288 on p1" in text, text
    assert text.count("Traceback (most recent call last)") == 1, text
    # The cell is named by the number the notebook shows for it.
    assert f"In[{out.reply['execution_count']}]" in text, text


def test_a_hang_folds_the_interrupts_and_the_state_says_out_of_step(k):
    out = k.execute(DIVERGE, timeout=120)
    assert out.status == "error"
    text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out.error["traceback"]))
    assert "interrupted at line" in text and "--verbose" in text, text
    assert "non-addressable" not in text and "Traceback" not in text, text
    assert "\n\n\n" not in text
    status = k.ok("%jaxsys status").stdout
    assert status.splitlines()[0].startswith("cluster: out of step ("), status
    restarted = k.ok("%jaxsys restart", timeout=180)
    assert restarted.stderr == "", restarted.stderr
    assert k.ok("%jaxsys status").stdout.splitlines()[0] == "cluster: ready"


def test_jaxsys_run_prints_no_transport_warning(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print(6 * 7)")]
    path = tmp_path / "t.ipynb"
    nbformat.write(nb, path)
    run = subprocess.run(
        [sys.executable, "-m", "jaxsys_kernel.cli", "run", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "without encryption" not in run.stderr, run.stderr
    # The kernel is shut down by its client, not left to notice its parent is gone.
    assert "Parent appears to have exited" not in run.stderr, run.stderr
