"""The fork server on real engines: local processes are forked from it, each in its own
session with its own environment and random state, a rank it cannot serve starts as a
plain engine, a launch survives the server's death, and nothing outlives a stop, the
death of the stand-in, or the death of the process that started the cluster; malformed
requests are refused while the world goes on, and the server's own death is said in words."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from IPython.core.error import UsageError

from jaxsys_kernel import Cluster
from jaxsys_kernel.cells.guard import check_processes
from jaxsys_kernel.cluster.launchers import forks
from jaxsys_kernel.cluster.teardown import pid_alive, sub_launchers

from ..harness import is_engine, new_tag, tagged_engines, tagged_processes, wait_no_processes

NPROCS = 3
WAIT_S = 60.0


def _me():
    import os

    import jax
    import numpy as np

    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "sid": os.getsid(0),
        "rank": jax.process_index(),
        "env_rank": os.environ["JAXSYS_PROCESS_ID"],
        "draw": float(np.random.rand()),
        "debug_nans": bool(jax.config.jax_debug_nans),
        "devices": len(jax.local_devices()),
    }


def _sum_of_ranks():
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    return int(multihost_utils.process_allgather(jnp.int32(jax.process_index())).sum())


def _wait(condition, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def cluster(monkeypatch):
    tag = new_tag()
    monkeypatch.setenv("JAXSYS_TEST_RUN", tag)
    c = Cluster(
        hosts=NPROCS,
        devices_per_host=2,
        standby=0,
        progress=lambda e: None,
        # A JAX option for one rank only (set in its child after the fork), and a JAX_*
        # variable that is no option of JAX's (that rank cannot be a fork).
        process_env={1: {"JAX_DEBUG_NANS": "true"}, 2: {"JAX_JAXSYS_NOT_AN_OPTION": "1"}},
    )
    c.start_sync()
    c.test_tag = tag
    try:
        yield c
    finally:
        c.kill()
    assert not wait_no_processes(tag, timeout=15)


def test_engines_are_forked_from_one_server_with_their_own_settings(cluster):
    server = cluster.world.launcher.forks
    assert server is not None and _alive(server.pid)
    me = {m["rank"]: m for m in cluster.world.view.apply_sync(_me)}
    assert sorted(me) == list(range(NPROCS))
    for rank, m in me.items():
        assert m["env_rank"] == str(rank)
        assert m["devices"] == 2
        # Its own session and group: teardown kills groups, not the server's.
        assert m["sid"] == m["pid"]
    assert me[0]["ppid"] == server.pid and me[1]["ppid"] == server.pid
    assert me[2]["ppid"] != server.pid, "a rank with a JAX_* variable JAX has no option for"
    assert [me[r]["debug_nans"] for r in range(NPROCS)] == [False, True, False]
    # NumPy's global generator is reseeded in every child.
    assert me[0]["draw"] != me[1]["draw"]
    assert cluster.world.view.apply_sync(_sum_of_ranks) == [sum(range(NPROCS))] * NPROCS
    es = cluster.world.launcher.engine_set(2)
    text = "".join(sub.get_output() or "" for sub in sub_launchers(es))
    assert "started without the fork server" in text and "JAX_JAXSYS_NOT_AN_OPTION" in text


def test_a_world_restart_forks_from_the_same_server(cluster):
    server = cluster.world.launcher.forks.pid
    before = {m["rank"]: m["pid"] for m in cluster.world.view.apply_sync(_me)}
    cluster.restart_sync()
    after = {m["rank"]: m for m in cluster.world.view.apply_sync(_me)}
    assert all(after[r]["pid"] != before[r] for r in before)
    assert after[0]["ppid"] == server and cluster.world.launcher.forks.pid == server
    assert cluster.world.view.apply_sync(_sum_of_ranks) == [sum(range(NPROCS))] * NPROCS
    assert not [pid for pid in before.values() if _alive(pid)]


def test_killing_the_stand_in_ends_its_engine(cluster):
    me = {m["rank"]: m for m in cluster.world.view.apply_sync(_me)}
    shims = [
        p for p in tagged_processes(cluster.test_tag) if "engine/forked.py" in " ".join(p.cmdline())
    ]
    assert len(shims) == 2, [" ".join(p.cmdline()) for p in shims]
    for shim in shims:
        shim.send_signal(signal.SIGKILL)
    _wait(
        lambda: not _alive(me[0]["pid"]) and not _alive(me[1]["pid"]),
        "the engines of killed stand-ins to end",
        15,
    )
    # The plain engine (rank 2) is not asserted on: with process 0 gone, JAX's coordination
    # service ends it too, sooner or later.


def test_a_launch_survives_the_servers_death(cluster):
    server = cluster.world.launcher.forks
    os.kill(server.pid, signal.SIGKILL)
    # The forked engines die with their server (their parent-death signal).
    _wait(
        lambda: len(tagged_engines(cluster.test_tag)) <= 1,
        "the forked engines to follow their server",
        15,
    )
    cluster.restart_sync()
    me = {m["rank"]: m for m in cluster.world.view.apply_sync(_me)}
    assert all(m["ppid"] != server.pid for m in me.values())
    assert cluster.world.view.apply_sync(_sum_of_ranks) == [sum(range(NPROCS))] * NPROCS


BAD_BODIES = [
    b"[]",
    b"[" * 200000,
    b'{"argv": ["\xff"]}',
    b"{argv",
    b'{"argv": [1], "env": {}}',
    b'{"argv": [], "env": {"A": 1}}',
]


def _ask(path: str, body: bytes, length: int | None = None) -> dict:
    """Send one request with four descriptors, as a stand-in does; the server's answer."""
    import array
    import json
    import socket
    import struct

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect(path)
        fds = array.array("i", [0, 1, 2, 1])
        header = struct.pack("!I", len(body) if length is None else length)
        try:
            conn.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            conn.sendall(body)
        except OSError:
            pass  # refused before it was read: the answer is waiting
        data = b""
        while b"\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return {"closed": len(data)}
            data += chunk
        return json.loads(data.split(b"\n")[0])


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def pair(monkeypatch):
    tag = new_tag()
    monkeypatch.setenv("JAXSYS_TEST_RUN", tag)
    c = Cluster(hosts=2, devices_per_host=1, standby=0, progress=lambda e: None)
    c.start_sync()
    c.test_tag = tag
    try:
        yield c
    finally:
        c.kill()
    assert not wait_no_processes(tag, timeout=15)


def test_malformed_requests_are_refused_and_the_world_goes_on(pair):
    server = pair.world.launcher.forks
    before = _fds(server.pid)
    answers = [_ask(server.socket_path, BAD_BODIES[i % len(BAD_BODIES)]) for i in range(300)]
    answers.append(_ask(server.socket_path, b"{}", length=1 << 30))
    refused = [a for a in answers if "refused" in a]
    assert len(refused) == len(answers), [a for a in answers if "refused" not in a][:3]
    assert _alive(server.pid)
    # The last refusal may reach us a moment before its connection is closed.
    _wait(lambda: _fds(server.pid) == before, f"{before} descriptors in the server", 5)
    # Cell code on an engine is no process the kernel started: refused before it is read.
    from_cells = pair.world.view.apply_sync(_ask, server.socket_path, b"[]")
    assert all("was not started by the kernel" in a["refused"] for a in from_cells), from_cells
    assert pair.world.view.apply_sync(_sum_of_ranks) == [1, 1]
    # A good request is still served: the next world is forked from the same server.
    pair.restart_sync()
    assert {m["ppid"] for m in pair.world.view.apply_sync(_me)} == {server.pid}
    assert pair.world.view.apply_sync(_sum_of_ranks) == [1, 1]


def test_the_fork_servers_death_is_reported_with_what_to_do(pair):
    server = pair.world.launcher.forks
    os.kill(server.pid, signal.SIGKILL)
    # Its engines die with it (their parent-death signal): the world is not usable.
    # Waited for by their pids: once the server is gone, an orphaned forked engine no longer
    # looks like an engine (its parent is not a fork server) for the short while it still runs.
    pids = [p.pid for p in pair.processes]
    _wait(
        lambda: not any(pid_alive(pid) for pid in pids), "the forked engines to follow their server"
    )
    with pytest.raises(UsageError) as e:
        check_processes(pair, pair.ranks, ())
    said = str(e.value)
    assert f"the fork server (pid {server.pid}) was killed by SIGKILL" in said
    assert "%jaxsys restart" in said
    assert forks.status_line(pair).startswith(f"fork server: the fork server (pid {server.pid})")
    # What it says to do works: the next world is plain engines, and a later death of one
    # of them is not blamed on the fork server.
    pair.restart_sync()
    assert pair.world.view.apply_sync(_sum_of_ranks) == [1, 1]
    os.kill(pair.processes[1].pid, signal.SIGKILL)
    _wait(
        lambda: pair.refresh_states() or pair.processes[1].state == "dead",
        "the killed plain engine to be seen dead",
    )
    assert "fork server" not in pair.processes[1].died, pair.processes[1].died
    # The stop (the fixture's kill) leaves no process.


PIDS_CGROUPS = Path("/sys/fs/cgroup/pids")


@pytest.fixture
def no_more_processes():
    """Put a process in a pids cgroup that allows no new process, as a full machine would."""
    if not (PIDS_CGROUPS / "cgroup.procs").exists() or not os.access(PIDS_CGROUPS, os.W_OK):
        pytest.skip("needs a writable cgroup v1 pids hierarchy")
    group = PIDS_CGROUPS / f"jaxsys-test-{new_tag()}"
    group.mkdir()

    def limit(pid: int) -> None:
        (group / "cgroup.procs").write_text(str(pid))
        # Its threads are tasks too: as many as it has now, and not one more.
        (group / "pids.max").write_text((group / "pids.current").read_text())

    try:
        yield limit
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                (PIDS_CGROUPS / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # gone already
        _wait(lambda: not (group / "cgroup.procs").read_text().split(), "an empty cgroup", 15)
        group.rmdir()


def test_a_failed_fork_starts_a_plain_engine_and_status_says_so(pair, no_more_processes):
    server = pair.world.launcher.forks
    no_more_processes(server.pid)
    pair.restart_sync()
    me = pair.world.view.apply_sync(_me)
    assert all(m["ppid"] != server.pid for m in me), "an engine was forked after all"
    assert pair.world.view.apply_sync(_sum_of_ranks) == [1, 1]
    assert _alive(server.pid)
    line = forks.status_line(pair)
    assert "2 engine(s) started plain after a failed fork" in line, line
    text = "".join(
        sub.get_output() or ""
        for r in pair.ranks
        for sub in sub_launchers(pair.world.launcher.engine_set(r))
    )
    assert "started without the fork server (the fork failed" in text


OWNER = textwrap.dedent(
    """
    from jaxsys_kernel import Cluster
    c = Cluster(hosts=2, devices_per_host=1, standby=1, progress=lambda e: None)
    c.start_sync()
    print("ready", c.world.launcher.forks.pid, flush=True)
    import time
    time.sleep(600)
    """
)


def test_nothing_outlives_the_process_that_started_the_cluster():
    tag = new_tag()
    env = {**os.environ, "JAXSYS_TEST_RUN": tag}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        line = owner.stdout.readline()
        assert line.split()[0] == "ready", line
        server = int(line.split()[1])
        _wait(
            lambda: len(tagged_engines(tag)) >= 2,
            "two engines of the owner's cluster",
        )
        forked = [p for p in tagged_engines(tag) if p.ppid() == server]
        assert forked and all(is_engine(p) for p in forked)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
    assert not wait_no_processes(tag, timeout=15)


def test_a_killed_kernels_socket_directory_is_removed_by_the_next_start(tmp_path):
    # A temporary directory too long for a socket path under the profile: the socket goes to
    # a short directory of its own, which a kernel killed with SIGKILL cannot remove.
    tmpdir = tmp_path / ("t" * 70)
    tmpdir.mkdir()
    tag = new_tag()
    env = {**os.environ, "JAXSYS_TEST_RUN": tag, "TMPDIR": str(tmpdir)}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER.replace("standby=1", "standby=0")],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = owner.stdout.readline()
        assert line.split()[0] == "ready", line
        left = list(Path("/tmp").glob(f"{forks.SOCKET_DIR_PREFIX}{owner.pid}-*"))
        assert len(left) == 1 and (left[0] / "s").exists(), left
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
    assert not wait_no_processes(tag, timeout=15)
    # What every fork server's start does first. Another test file's cluster, started
    # meanwhile on another pytest-xdist worker, may have done it already: either way the
    # directory is gone, and only remove_stale_socket_dirs removes it.
    removed = forks.remove_stale_socket_dirs()
    assert not left[0].exists(), removed
