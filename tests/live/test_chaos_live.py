"""Fault injection through a real kernel: the controller, the fork server, a standby engine,
a telemetry agent and the kernel itself are killed, idle and while a cell runs. Each death is
survived (the next cell works) or reported in words naming what died and what to do, and
nothing is left: no process carrying the test's tag, no profile, fork-socket or trace
directory. bench/chaos.py runs the same faults in loops for the figures."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from jaxsys_kernel import contract
from jaxsys_kernel.cluster.launchers.forks import SOCKET_DIR_PREFIX

from ..harness import Kernel, new_tag, tagged_engines, wait_no_processes

START = "%jaxsys start --hosts 2 --devices-per-host 1 --standby 1"
RANKS = "%%multihost\nimport jax\nprint('rank', jax.process_index())"
WAIT_S = 60.0
KERNEL_KILLS = 3
TMP = Path(tempfile.gettempdir())


def _wait(cond, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        time.sleep(0.1)


def _kernel_side(k: Kernel, expr: str):
    """``expr`` evaluated in the kernel (``c`` is the cluster), as JSON."""
    out = k.ok(
        f"import json as _j\nc = get_ipython()._jaxsys_session.cluster\nprint(_j.dumps({expr}))"
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _dirs_of(pid: int) -> list[Path]:
    """The profile and fork-socket directories of the kernel ``pid``."""
    found = []
    for base in {TMP, Path("/tmp")}:
        for prefix in (contract.PROFILE_PREFIX, SOCKET_DIR_PREFIX):
            found += base.glob(f"{prefix}{pid}-*")
    return found


def _traces() -> set[Path]:
    return set(TMP.glob("jaxsys-trace-*"))


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _ranks_ok(k: Kernel) -> None:
    out = k.execute(RANKS)
    assert out.status == "ok", f"{out.error}\n{out.stderr}"
    assert "[p0] rank 0" in out.stdout and "[p1] rank 1" in out.stdout, out.stdout


def _standby_ready(k: Kernel) -> list[int]:
    """The standby engines' pids once one is ready."""
    return _wait(
        lambda: _kernel_side(k, "c.standby_status()['ready'] and c.world.standby.pids(c.world)"),
        "a ready standby engine",
    )


def _engines_settle(k: Kernel) -> None:
    """The world's two engines and at most one standby: nothing of a killed one is left."""
    _wait(lambda: len(tagged_engines(k.tag)) <= 3, "at most 2 engines and 1 standby", 15)


def _error_text(out) -> str:
    return (out.error or {}).get("evalue", "") + out.stderr


@pytest.fixture(scope="module")
def k():
    tag = new_tag()
    traces = _traces()
    kernel = Kernel(tag, extra_env={"JAXSYS_STANDBY": "1"})
    try:
        out = kernel.execute(START)
        assert out.status == "ok", out.stderr
        yield kernel
        out = kernel.execute("%jaxsys stop")
        assert out.status == "ok", _error_text(out)
    finally:
        pid = kernel.pid
        kernel.shutdown()
        left = wait_no_processes(tag, timeout=15)
        for line in left:
            os.kill(int(line.split()[0]), signal.SIGKILL)
    assert not left, left
    assert not _dirs_of(pid)
    assert not _traces() - traces


def _cell_under_way(k: Kernel, code: str, marker: str = "started") -> str:
    """Send ``code`` and return once every process has printed ``marker``."""
    msg_id = k.kc.execute(code)
    seen = ""
    deadline = time.monotonic() + WAIT_S
    while marker not in seen:  # collated: "[p0-1] started" once both have
        msg = k.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            seen += msg["content"]["text"]
        assert time.monotonic() < deadline, f"the cell never started: {seen!r}"
    return msg_id


def _finish(k: Kernel, msg_id: str, timeout: float = WAIT_S) -> tuple[str, str]:
    """The status of the cell ``msg_id`` and what it wrote, once it has ended."""
    text = ""
    deadline = time.monotonic() + timeout
    while True:
        msg = k.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        c = msg["content"]
        if msg["msg_type"] == "stream":
            text += c["text"]
        elif msg["msg_type"] == "error":
            text += f"{c['ename']}: {c['evalue']}"
        elif msg["msg_type"] == "status" and c["execution_state"] == "idle":
            break
    reply = k._shell_reply(msg_id)
    return reply["content"]["status"], text + reply["content"].get("evalue", "")


def test_a_killed_standby_engine_is_survived_and_not_counted(k):
    spares = _standby_ready(k)
    for pid in spares:
        os.kill(pid, signal.SIGKILL)
    _ranks_ok(k)
    # The status no longer counts a dead engine as ready for a restart.
    _wait(
        lambda: "standby: 0 of 1" in k.ok("%jaxsys status").stdout,
        "the status to stop counting the killed standby engine",
        10,
    )
    out = k.execute("%jaxsys restart")
    assert out.status == "ok", _error_text(out)
    _ranks_ok(k)
    _engines_settle(k)


def test_a_standby_engine_killed_during_a_cell_is_survived(k):
    spares = _standby_ready(k)
    out = k.execute(
        "%%multihost\nimport time\ntime.sleep(1.5)\nprint('slept')",
        on_start=lambda: [os.kill(pid, signal.SIGKILL) for pid in spares],
    )
    assert out.status == "ok" and "[p0-1] slept" in out.stdout, _error_text(out)
    _ranks_ok(k)
    _engines_settle(k)


CLOSE_AGENT = "from jaxsys_kernel.engine.state import STATE\nSTATE.agent._sock.close()\n"


def _heartbeats_fresh(k: Kernel) -> bool:
    ages = _kernel_side(
        k, "[l.heartbeat_age for l in c.telemetry.liveness({p.rank: p.state for p in c.processes})]"
    )
    return all(a is not None and a < 2.5 for a in ages)


def test_a_telemetry_agent_whose_socket_dies_idle_mends_it(k):
    out = k.execute("%%multihost\n" + CLOSE_AGENT + "print('closed')")
    assert out.status == "ok", _error_text(out)
    # The next cell's hooks and a compile's listeners send through the dead socket.
    out = k.execute(
        "%%multihost\nimport jax, jax.numpy as jnp\nprint(int(jax.jit(lambda x: x + 2)(1)))"
    )
    assert out.status == "ok" and "[p0-1] 3" in out.stdout, _error_text(out)
    _wait(lambda: _heartbeats_fresh(k), "heartbeats from both processes again", 15)


def test_a_telemetry_agent_whose_socket_dies_during_a_cell_mends_it(k):
    out = k.execute(
        "%%multihost\nimport jax, time\n"
        + CLOSE_AGENT
        + "time.sleep(1.2)\nprint(int(jax.jit(lambda x: x * 5)(2)))"
    )
    assert out.status == "ok" and "[p0-1] 10" in out.stdout, _error_text(out)
    _wait(lambda: _heartbeats_fresh(k), "heartbeats from both processes again", 15)
    _ranks_ok(k)


def _fork_server(k: Kernel) -> int:
    """The fork server's pid; a new cluster first when the last one's server was killed
    (a restart after its death starts plain engines and no new server)."""
    pid = _kernel_side(k, "c.world.launcher.forks.pid")
    if not _gone(pid):
        return pid
    for line in ("%jaxsys stop", START):
        out = k.execute(line)
        assert out.status == "ok", _error_text(out)
    return _kernel_side(k, "c.world.launcher.forks.pid")


FORK_SERVER_DIED = "the fork server (pid {pid}) was killed by SIGKILL"


def test_the_fork_server_killed_idle_is_reported_and_restart_mends_it(k):
    pid = _fork_server(k)
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: _gone(pid), "the fork server to go", 10)
    out = _wait(lambda: (o := k.execute(RANKS)).status == "error" and o, "a cell refused", 15)
    said = _error_text(out)
    assert FORK_SERVER_DIED.format(pid=pid) in said and "%jaxsys restart" in said, said
    out = k.execute("%jaxsys restart")
    assert out.status == "ok", _error_text(out)
    _ranks_ok(k)
    _engines_settle(k)


def _kill_kernel(k: Kernel) -> None:
    os.kill(k.pid, signal.SIGKILL)
    k.kc.stop_channels()
    k.km.cleanup_resources()


def test_the_fork_server_killed_during_a_cell_is_reported_and_restart_mends_it(k):
    pid = _fork_server(k)
    msg_id = _cell_under_way(
        k, "%%multihost\nimport time\nprint('started', flush=True)\ntime.sleep(30)"
    )
    os.kill(pid, signal.SIGKILL)
    status, text = _finish(k, msg_id)
    assert status == "error", text
    # The cell ends at once; the next one names what died and what to do.
    out = k.execute(RANKS)
    said = _error_text(out)
    assert FORK_SERVER_DIED.format(pid=pid) in said and "%jaxsys restart" in said, said
    out = k.execute("%jaxsys restart")
    assert out.status == "ok", _error_text(out)
    _ranks_ok(k)
    _engines_settle(k)


def _controller(k: Kernel) -> int:
    return _kernel_side(k, "c.world.ipp.controller.process.pid")


def _controller_reported_or_survived(k: Kernel, pid: int) -> None:
    """After the controller's death: cells work, and a restart either works or says that
    the controller died and that a new start is needed, within seconds."""
    t0 = time.monotonic()
    out = k.execute("%jaxsys restart", timeout=60)
    took = time.monotonic() - t0
    if out.status == "ok":
        _ranks_ok(k)
        return
    said = _error_text(out)
    assert f"controller (pid {pid})" in said and "%jaxsys start" in said, said
    # 0.2 s here; waiting for a dead hub to drop the old engines took 5 s more.
    assert took < 4, f"the restart took {took:.1f} s to find the controller dead"
    out = k.execute(START)
    assert out.status == "ok", _error_text(out)
    _ranks_ok(k)


def test_the_controller_killed_idle_is_survived_or_reported(k):
    pid = _controller(k)
    os.kill(pid, signal.SIGKILL)
    _ranks_ok(k)  # its schedulers still route the cells
    _controller_reported_or_survived(k, pid)


def test_the_controller_killed_during_a_cell_is_survived_or_reported(k):
    pid = _controller(k)
    msg_id = _cell_under_way(
        k, "%%multihost\nimport time\nprint('started', flush=True)\ntime.sleep(1)"
    )
    os.kill(pid, signal.SIGKILL)
    status, text = _finish(k, msg_id)
    assert status == "ok" or "controller" in text, text
    _controller_reported_or_survived(k, pid)


@pytest.mark.parametrize("during_cell", [False, True, False][:KERNEL_KILLS])
def test_a_kernel_killed_leaves_nothing(during_cell, tmp_path):
    tag = new_tag()
    traces = _traces()
    kernel = Kernel(tag)
    pid = kernel.pid
    try:
        out = kernel.execute(START.replace("--standby 1", "--standby 0"))
        assert out.status == "ok", out.stderr
        assert _dirs_of(pid)
        if during_cell:
            # A profiled cell: each process is writing a trace of its own when it dies.
            _cell_under_way(
                kernel,
                f"%%multihost --profile-dir {tmp_path}\n"
                "import time\nprint('started', flush=True)\ntime.sleep(30)",
            )
        _kill_kernel(kernel)
    finally:
        left = wait_no_processes(tag, timeout=15)
        for line in left:
            os.kill(int(line.split()[0]), signal.SIGKILL)
    assert not left, left
    _wait(lambda: not _dirs_of(pid), f"no directory of the killed kernel {pid}", 10)
    assert not _traces() - traces
    assert not list(tmp_path.iterdir())  # no merged trace of a cell that never ended
