"""Hostile input and faults against a real kernel with a 2-process cluster.

The audit is checked against the operating system's own list of listening sockets; every
socket it lists gets intruders without keys and with wrong keys; code on an engine that
holds the telemetry key sends malformed, huge and out-of-range events; engines are killed
mid-cell, mid-collective, during a world restart, and process 0 (the coordinator) goes
away. After each, the cluster computes again and no process is left over."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest

from ..harness import (
    kernel_with_cluster,
    process_states,
    status_table,
    tagged_engines,
)
from ..intruders import (
    AUDIT_CELL,
    HEALTH_CELL,
    KEY_HOLDER,
    KINDS,
    MALFORMED,
    knock_all,
    zmtp_mechanism,
)

COLLECTIVE = """%%multihost --timeout 60
import jax, jax.numpy as jnp
from jax.experimental import multihost_utils as mu
print('sum', float(mu.process_allgather(jnp.ones(2) * (jax.process_index() + 1)).sum()))
"""
COMPUTES = "[p0-1] sum 6.0\n"


@pytest.fixture(scope="module")
def k(tag):
    with kernel_with_cluster(tag, "%jaxsys start --hosts 2 --devices-per-host 1") as kernel:
        yield kernel


def kernel_json(k, code: str) -> dict:
    return json.loads(k.ok(code).stdout.strip().splitlines()[-1])


def engine_pids(k) -> list[int]:
    table = status_table(k.ok("%jaxsys status").stdout)
    return [int(table[r]["pid"]) for r in sorted(table)]


def engines_left(tag: str) -> list[psutil.Process]:
    return tagged_engines(tag)


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def recover_and_compute(k, tag: str) -> None:
    """The documented recovery (a world restart), then a collective; nothing left over."""
    out = k.ok("%jaxsys restart", timeout=120)
    assert "JAX world ready again" in out.stdout
    assert k.ok(COLLECTIVE).stdout == COMPUTES
    wait_for(lambda: len(engines_left(tag)) == 2, 10, "exactly two engines")


# -- the audit ----------------------------------------------------------------------------------


def test_the_audit_lists_every_listening_socket_of_the_cluster_and_the_kernel(k):
    assert k.ok(COLLECTIVE).stdout == COMPUTES  # gloo listens once collectives have run
    found = kernel_json(k, AUDIT_CELL)
    ours = [e for e in found["audit"] if e["name"] != "Jupyter server"]
    # The fork server's Unix socket is listed too; the OS side of this check lists TCP.
    unix = [e for e in ours if e["address"].startswith("/")]
    assert [e["address"].rsplit("/", 1)[1] for e in unix] == ["forkserver.sock"], unix
    ours = [e for e in ours if e not in unix]
    listed = {e["address"] for e in ours}
    assert listed == set(found["os"]), (
        f"missing {set(found['os']) - listed}, extra {listed - set(found['os'])}"
    )
    names = {e["name"] for e in ours}
    for role in ("control", "mux", "task", "iopub", "broadcast"):
        assert f"ipyparallel {role} (client-facing)" in names
    assert {"ipyparallel notification (client-facing)", "ipyparallel registration"} <= names
    assert "ipyparallel internal (scheduler tree, monitor)" in names
    assert "ipykernel IOPub pipe (output of forked subprocesses)" in names
    assert {"Jupyter kernel channels: shell", "Jupyter kernel channels: heartbeat"} <= names
    assert "jaxsys telemetry" in names
    assert not [e for e in ours if e["protection"] == "unknown"]
    # Every ZeroMQ port is protected as the audit says: its own greeting names the mechanism.
    for e in ours:
        host, port = e["address"].rsplit(":", 1)
        if e["protection"] == "CurveZMQ":
            assert zmtp_mechanism(host, int(port)) == "CURVE", e
        elif e["name"].startswith(("Jupyter kernel", "ipykernel")):
            assert zmtp_mechanism(host, int(port)) in ("NULL", ""), e


def test_security_shows_the_receivers_health_and_every_socket(k):
    out = k.ok("%jaxsys security").stdout
    assert "ipyparallel mux (client-facing)" in out and "ipykernel IOPub pipe" in out
    assert "telemetry: receiving;" in out and "event(s) taken" in out


# -- intruders on every port --------------------------------------------------------------------


def test_intruders_on_every_listening_port_leave_the_cluster_computing(k):
    before = kernel_json(k, AUDIT_CELL)
    # Every TCP listener (the fork server's Unix socket has its own tests: test_forkserver).
    addresses = [
        e["address"]
        for e in before["audit"]
        if e["name"] != "Jupyter server" and not e["address"].startswith("/")
    ]
    attempts = knock_all(addresses)
    assert len(attempts) == len(addresses) * len(KINDS) >= 5 * 25
    # The cluster computes, no process died, and every listener is still there.
    assert k.ok(COLLECTIVE).stdout == COMPUTES
    assert process_states(k.ok("%jaxsys status").stdout) == {0: "ready", 1: "ready"}
    after = kernel_json(k, AUDIT_CELL)
    assert set(after["os"]) >= set(before["os"])
    health = kernel_json(k, HEALTH_CELL)
    # The wrong-key and keyless ZeroMQ intruders at the telemetry port were counted.
    assert health["health"]["handshakes_refused"] >= 2 and health["health"]["alive"]
    assert health["live"] == ["alive", "alive"]


def test_the_controllers_public_key_alone_runs_code_on_every_engine(k):
    """What docs/security.md says: no client allow-list, no signing, with Curve on."""
    import ipyparallel

    path = k.ok(
        "from jaxsys_kernel.cluster.profile import controller_file\n"
        "_ipp = get_ipython()._jaxsys_session.cluster._ipp\n"
        "print(controller_file(_ipp.profile_dir, _ipp.cluster_id, 'client'))"
    ).stdout.strip()
    with open(path) as fh:
        info = json.load(fh)
    assert info["curve_serverkey"] and info["key"] == ""  # Curve on, signing off
    client = ipyparallel.Client(path, timeout=30)  # a key pair of its own
    try:
        pids = client[:].apply_sync(os.getpid)
    finally:
        client.close()
    assert sorted(pids) == sorted(engine_pids(k))


# -- a key holder -------------------------------------------------------------------------------


def test_a_key_holder_cannot_stop_telemetry_or_grow_the_kernel(k):
    kernel = psutil.Process(k.pid)
    rss_before = kernel.memory_info().rss
    before = kernel_json(k, HEALTH_CELL)["health"]
    out = k.ok(KEY_HOLDER.format(malformed=MALFORMED), timeout=120)
    assert "[p1] sent" in out.stdout

    told = [out.stderr]

    def settled():
        out = k.ok(HEALTH_CELL)
        told.append(out.stderr)
        now = json.loads(out.stdout.strip().splitlines()[-1])
        dropped = sum(now["health"]["dropped"].values()) - sum(before["dropped"].values())
        return now if dropped >= len(MALFORMED) and "10.9.8.7" in now["refused"] else None

    now = wait_for(settled, 20, "the malformed events to be counted")
    # Heartbeats are still taken: both processes show alive, and the count grows.
    assert now["live"] == ["alive", "alive"] and now["health"]["alive"]
    assert now["health"]["accepted"] > before["accepted"]
    wait_for(
        lambda: kernel_json(k, HEALTH_CELL)["health"]["accepted"] > now["health"]["accepted"],
        10,
        "heartbeats after the malformed events",
    )
    # 400 MB were sent; ZeroMQ refused each before reading it.
    grown = kernel.memory_info().rss - rss_before
    assert grown < 32 << 20, f"the kernel grew by {grown >> 20} MiB"
    # The forged refusal was told like any other, after the cell in which it arrived.
    assert "refused 1 connection(s) from 10.9.8.7" in "".join(told)
    assert k.ok(COLLECTIVE).stdout == COMPUTES


# -- faults -------------------------------------------------------------------------------------


def _start_and_kill(k, cell: str, victim: int, marker: str) -> dict:
    """Start ``cell``, SIGKILL process ``victim`` once the cell printed ``marker``."""
    pid = engine_pids(k)[victim]
    msg_id = k.kc.execute(cell)
    deadline = time.monotonic() + 60
    while True:
        msg = k.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream" and marker in msg["content"]["text"]:
            break
    os.kill(pid, signal.SIGKILL)
    reply = k._shell_reply(msg_id, timeout=90)
    wait_for(lambda: not psutil.pid_exists(pid) or _zombie(pid), 10, "the victim to go")
    return reply["content"]


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_kill_mid_cell(k, tag):
    cell = "%%multihost --grace 2\nimport time\nprint('running', flush=True)\ntime.sleep(60)"
    reply = _start_and_kill(k, cell, victim=1, marker="running")
    # Named as the process's death, never as ipyparallel's EngineError.
    assert reply["status"] == "error" and "ProcessDied on p1" in reply["evalue"]
    # A killed engine's error reads as lines, not one character per line.
    assert all(len(line) > 1 for line in reply["traceback"] if line.strip()), reply["traceback"]
    recover_and_compute(k, tag)


def test_kill_mid_collective(k, tag):
    cell = (
        "%%multihost --timeout 60 --grace 2\n"
        "import jax.numpy as jnp\n"
        "from jax.experimental import multihost_utils as mu\n"
        "mu.process_allgather(jnp.ones(2))\n"
        "print('collecting', flush=True)\n"
        "while True:\n"
        "    mu.process_allgather(jnp.ones(2))\n"
    )
    t0 = time.monotonic()
    reply = _start_and_kill(k, cell, victim=1, marker="collecting")
    assert reply["status"] == "error"
    assert time.monotonic() - t0 < 45  # the survivor is not left waiting for the timeout
    recover_and_compute(k, tag)


def _finish(k, msg_id: str, timeout: float = 120) -> tuple[dict, str]:
    """The reply to a request already sent, and what it wrote to stderr."""
    stderr = ""
    deadline = time.monotonic() + timeout
    while True:
        msg = k.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stderr":
            stderr += msg["content"]["text"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return k._shell_reply(msg_id)["content"], stderr


def test_kill_during_a_world_restart(k, tag):
    old = set(engine_pids(k))
    msg_id = k.kc.execute("%jaxsys restart")

    def new_engine():
        fresh = [p for p in engines_left(tag) if p.pid not in old]
        return fresh[0] if fresh else None

    victim = wait_for(new_engine, 60, "a new engine")
    victim.kill()
    reply, stderr = _finish(k, msg_id)
    if reply["status"] == "ok":
        # The restart finished before the kill: the process is shown dead; restart again.
        wait_for(lambda: "dead" in k.ok("%jaxsys status").stdout, 10, "the death to show")
        recover_and_compute(k, tag)
        return
    # The restart saw the process die: it names it, stops the cluster and says how to go on.
    assert "exited with code -9" in reply["evalue"]
    assert "the cluster was stopped; start a new one with %jaxsys start" in stderr
    wait_for(lambda: not engines_left(tag), 10, "no engine left after the failed restart")
    k.ok("%jaxsys start --hosts 2 --devices-per-host 1", timeout=180)
    assert k.ok(COLLECTIVE).stdout == COMPUTES
    wait_for(lambda: len(engines_left(tag)) == 2, 10, "exactly two engines")


def test_the_coordinator_disappears(k, tag):
    os.kill(engine_pids(k)[0], signal.SIGKILL)
    wait_for(
        lambda: process_states(k.ok("%jaxsys status").stdout)[0] == "dead",
        10,
        "process 0 to show dead",
    )
    out = k.execute(COLLECTIVE)
    assert out.status == "error" and "p0" in out.error["evalue"]
    recover_and_compute(k, tag)
