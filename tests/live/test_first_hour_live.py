"""A newcomer's faults on a real 2-process cluster: every message after a fault ends in a path
that works when followed as printed, and says what was lost."""

from __future__ import annotations

import re
import time

import pytest

from ..harness import kernel_with_cluster, process_states

pytestmark = pytest.mark.slow

SETUP = """%%multihost
import jax, numpy as np, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
params = np.ones((1,), np.float32)
"""
# A sum over both processes' devices in the order `devices` (a collective on CPU: gloo).
COLLECTIVE = """
mesh = jax.make_mesh((len(devices),), ("x",), devices=devices)
a = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), params)
print("sum", float(jax.jit(jnp.sum)(a)))
"""


@pytest.fixture(scope="module")
def k(tag):
    with kernel_with_cluster(
        tag, "%jaxsys start --hosts 2 --devices-per-host 1 --heartbeat 2"
    ) as kernel:
        yield kernel


def _commands(text: str) -> list[str]:
    return re.findall(r"%jaxsys restart(?: \d+)?", text)


# Process 1 writes to its native stderr, waits until its log holds the line (a reader thread
# copies it there), then dies.
DIES = """%%multihost
import os, signal, time
from jaxsys_kernel.engine import output
if jax.process_index() == 1:
    os.write(2, b"last words of p1\\n")
    deadline = time.monotonic() + 10
    while "last words" not in output.log_tail(5) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_death_names_the_process_its_signal_the_cell_and_its_last_words(k):
    k.ok(SETUP)
    out = k.execute(DIES, timeout=60)
    assert out.status == "error", out
    shown = "\n".join(out.error["traceback"])
    number = out.reply["execution_count"]
    assert f"process 1 died while running cell [{number}]" in shown, shown
    assert "killed by SIGKILL" in shown and "last words of p1" in shown, shown
    assert "EngineError" not in shown and "Engine 1" not in shown, shown
    # Its log stays readable while it is dead.
    log = k.ok("%jaxsys logs 1").stdout
    assert "process 1 is dead" in log and "last words of p1" in log, log
    k.ok("%jaxsys restart 1", timeout=120)


def test_the_kill_message_leads_to_a_working_collective(k):
    k.ok(SETUP)
    k.ok("%%multihost\ndevices = jax.devices()\n" + COLLECTIVE)  # gloo now knows this order
    killed = k.ok("%jaxsys kill 1").stdout
    # The path, from the kill message alone: its first command brings process 1 back.
    assert "%jaxsys restart 1" in killed and "starts empty" in killed, killed
    rejoined = k.ok(_commands(killed)[0], timeout=120).stdout
    # The restart says that p1 is empty, what it lacks and how to rebuild it...
    assert "Process 1 starts empty and lacks " in rejoined, rejoined
    lacks = rejoined.split("and lacks ", 1)[1].split(", which", 1)[0]
    assert {"jax", "np", "params", "devices", "mesh"} <= set(lacks.split(", ")), rejoined
    assert "%%multihost --procs 1" in rejoined, rejoined
    # ... and what a collective needs on CPU, as code to copy.
    devices_line = re.search(r"`(devices = [^`]+)`", rejoined)
    assert devices_line, rejoined
    k.ok("%%multihost --procs 1\n" + SETUP.split("\n", 1)[1])
    out = k.ok("%%multihost\n" + devices_line.group(1) + "\n" + COLLECTIVE, timeout=60)
    assert out.stdout == "[p0-1] sum 2.0\n", out.stdout + out.stderr


def test_a_world_restart_says_every_name_is_gone(k):
    out = k.ok("%jaxsys restart", timeout=120)
    assert "All names defined on the processes are gone" in out.stdout, out.stdout
    assert "re-run the cells that built them, or restore from a checkpoint" in out.stdout


def test_process_zero_killed_says_up_front_only_a_world_restart_helps(k):
    killed = k.ok("%jaxsys kill 0").stdout
    assert "cannot come back alone" in killed and "%jaxsys restart restarts" in killed, killed
    assert "restart 0" not in killed and "keep running" not in killed, killed
    # Process 0's death ends the other one (the coordination service went with it).
    deadline = time.monotonic() + 30
    while True:
        status = k.ok("%jaxsys status").stdout
        if set(process_states(status).values()) == {"dead"} or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(process_states(status).values()) == {"dead"}, status
    assert "degraded" not in status and "%jaxsys restart" in status.splitlines()[0], status
    refused = k.execute("%%multihost\nprint(1)")
    assert refused.status == "error", refused
    assert "--procs ..." not in refused.error["evalue"], refused.error["evalue"]
    assert "%jaxsys restart restarts the whole world" in refused.error["evalue"]
    # Followed as printed, the world comes back and a collective works.
    k.ok(_commands(killed)[0], timeout=120)
    k.ok(SETUP)
    out = k.ok("%%multihost\ndevices = jax.devices()\n" + COLLECTIVE, timeout=60)
    assert out.stdout == "[p0-1] sum 2.0\n", out.stdout + out.stderr


def test_cells_are_named_as_the_notebook_shows_them(k):
    first = k.ok("%%multihost --procs 0\nonly_here = 1")
    n = first.reply["execution_count"]
    out = k.execute("%%multihost\nprint(only_here)")
    m = out.reply["execution_count"]
    # The out-of-step warning: a warning, naming both cells by number and first line.
    assert out.stderr.startswith("Warning: these processes are out of step"), out.stderr
    assert f"([{n}] only_here = 1)" in out.stderr, out.stderr
    assert f"this one ([{m}] print(only_here)) will hang" in out.stderr, out.stderr
    # p1 lacks the name; the error says why.
    assert out.status == "error", out
    shown = "\n".join(out.error["traceback"])
    assert f"only_here was defined only on p0, by cell [{n}] only_here = 1" in shown, shown
    # Warnings collated from the processes name the cell by its number.
    warned = k.ok("%%multihost\nimport warnings\nwarnings.warn('careful')")
    assert f"<cell [{warned.reply['execution_count']}]>:2: UserWarning: careful" in warned.stderr, (
        warned.stderr
    )


def test_jax_in_the_kernel_beside_a_cluster_gets_one_hint(k):
    out = k.ok("import jax\nprint(len(jax.devices()))")
    assert out.stdout.startswith("1\n"), out.stdout
    assert "jaxsys: this cell ran in the kernel" in out.stdout, out.stdout
    assert "%%multihost" in out.stdout and "%multihost on" in out.stdout, out.stdout
    assert "ran in the kernel" not in k.ok("print(jax.process_count())").stdout  # said once


def test_a_single_percent_multihost_followed_by_code_runs_nothing(k):
    out = k.execute("%multihost --procs 0\nran_in_kernel = 1")
    assert out.status == "error", out
    assert "Did you mean %%multihost (two %)" in out.error["evalue"], out.error
    assert k.ok("print('ran_in_kernel' in globals())").stdout == "False\n"


def _stamp(msg: dict) -> float:
    date = msg["header"]["date"]
    return date.timestamp() if hasattr(date, "timestamp") else 0.0


def test_a_cell_waiting_for_processes_that_do_not_run_it_says_so_within_5_s(k):
    from .test_labextension_comm import CommClient

    client = CommClient(k)
    client.wait_state(lambda s: s["cluster"] is not None, timeout=30, what="with a cluster")
    k.ok(SETUP)
    out = k.execute(
        "%%multihost --procs 0 --timeout 10\ndevices = jax.devices()\n" + COLLECTIVE, timeout=60
    )
    said = [
        m
        for m in out.messages
        if m["msg_type"] == "stream" and "in a JAX call" in m["content"]["text"]
    ]
    assert said, out.stderr
    text = said[0]["content"]["text"]
    assert text.startswith("jaxsys: p0 waits in a JAX call") and "p1 idle does not run" in text, (
        text
    )
    began = next(m for m in out.messages if m["msg_type"] == "execute_input")
    assert _stamp(said[0]) - _stamp(began) < 5, (_stamp(said[0]) - _stamp(began), text)
    # The state the front end reads shows the wait while it lasts.
    states = [
        m["content"]["data"]["state"]
        for m in out.messages
        if m["msg_type"] == "comm_msg" and m["content"]["data"].get("type") == "state"
    ]
    healths = [s["health"] for s in states if s.get("health")]
    assert any(h["state"] == "waiting" and "p0 waits for p1" in h["reason"] for h in healths), (
        healths
    )
    assert healths[-1]["state"] != "waiting", healths
    k.ok("%jaxsys restart", timeout=120)


def test_fetching_an_array_that_spans_processes_suggests_pull(k):
    k.ok(SETUP)
    out = k.execute(
        "%%multihost\ndevices = jax.devices()\n"
        + COLLECTIVE.replace('print("sum", float(jax.jit(jnp.sum)(a)))', "np.asarray(a)")
    )
    assert out.status == "error", out
    shown = "\n".join(out.error["traceback"])
    assert "jaxsys: this array spans processes" in shown and "%pull NAME" in shown, shown


def test_a_hang_is_reported_by_name(k):
    out = k.execute(
        "%%multihost --grace 2\n"
        "import jax\n"
        "from jax.experimental import multihost_utils\n"
        "if jax.process_index() == 1:\n"
        "    raise OSError('no batch here')\n"
        "multihost_utils.sync_global_devices('step')\n",
        timeout=60,
    )
    assert out.status == "error" and out.error["ename"] == "MultihostHang", out.error
    assert out.error["traceback"][-1].startswith("MultihostHang: OSError on p1"), out.error
    assert "jaxsys: interrupting p0\n" in out.stderr, out.stderr
    k.ok("%jaxsys restart", timeout=120)
