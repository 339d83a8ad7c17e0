"""Read-only watchers: three kernels watch a cluster that ``jaxsys cluster start`` owns; they
see its processes, are refused cells, stop and restart, start nothing and write nothing,
and the owner's cells run on. A watcher sees the owner's live numbers: its cache hits and
misses, its steps and the straggler named, and says when the owner stops writing them."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import time

import psutil

from ..harness import Kernel, process_states

JAXSYS = [sys.executable, "-m", "jaxsys_kernel.cli"]
NAME = "watched"


def jaxsys(*args, env):
    return subprocess.run([*JAXSYS, *args], capture_output=True, text=True, env=env, timeout=180)


def owner_cell(connection_file: str) -> list:
    """A cell of the owner's: each process's index and the sum of a value over all of them."""
    import ipyparallel as ipp

    code = (
        "import jax, jax.numpy as jnp\n"
        "from jax.experimental import multihost_utils as mu\n"
        "answer = (jax.process_index(), int(mu.process_allgather(jnp.ones(())).sum()))"
    )
    client = ipp.Client(connection_file)
    try:
        view = client[:]
        # Results only, with a deadline: block=True would also wait for the cell's iopub
        # output, which a client that has just connected may never see.
        view.execute(code, block=False).get(timeout=120)
        return sorted(view.pull("answer", block=False).get(timeout=60))
    finally:
        client.close()


def shown(out) -> str:
    """The text of the status a cell displayed (a watcher's status is a live display)."""
    return "\n".join(d.get("text/plain", "") for d in out.displays)


def published(directory) -> list[str]:
    """The files the owner publishes; not the hidden one it writes its live numbers to for
    a moment before each replace."""
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def redrawn_dead(kernel: Kernel, timeout: float = 30.0) -> bool:
    """Whether the watcher's live status is redrawn showing dead processes within ``timeout``.

    Read straight from the kernel's IOPub channel, whatever request the update names as its
    parent: the refresh thread's one last update may come while no cell runs.
    """
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            m = kernel.kc.get_iopub_msg(timeout=min(1.0, remaining))
        except queue.Empty:
            continue
        if m["msg_type"] == "update_display_data":
            text = m["content"]["data"].get("text/plain", "")
            if process_states(text) == {0: "dead", 1: "dead"}:
                return True
    return False


def test_three_watchers_see_the_cluster_and_cannot_touch_it(tag, tmp_path):
    env = dict(os.environ, JAXSYS_STATE_DIR=str(tmp_path))
    kernels: list[Kernel] = []
    try:
        r = jaxsys(
            "cluster", "start", "--name", NAME, "--hosts", "2", "--devices-per-host", "1", env=env
        )
        assert r.returncode == 0, r.stderr
        state = json.loads((tmp_path / f"{NAME}.json").read_text())
        assert owner_cell(state["connection_file"]) == [(0, 2), (1, 2)]
        files_before = published(tmp_path)
        engines = {p["pid"] for p in state["processes"]}

        kernels = [Kernel(tag, extra_env={"JAXSYS_STATE_DIR": str(tmp_path)}) for _ in range(3)]
        for k in kernels:
            out = k.ok(f"%jaxsys watch {NAME}")
            assert f"watching cluster {NAME!r} (read-only): 2 of 2 processes live" in out.stdout
            status = shown(k.ok("%jaxsys status"))
            assert process_states(status) == {0: "ready", 1: "ready"}, status
            for cell in (
                "%%multihost\nprint('ran')",
                "%jaxsys stop",
                "%jaxsys restart",
                "%jaxsys restart 1",
                "%jaxsys start --hosts 2",
            ):
                out = k.execute(cell)
                said = out.stderr + str((out.error or {}).get("evalue"))
                assert out.status == "error", cell
                assert "ran" not in out.stdout
                assert f"only watches cluster {NAME!r}" in said, said
                assert f"--name {NAME}` (pid {state['pid']})" in said and "%jaxsys unwatch" in said

        # A watcher starts no process and writes nothing where the owner publishes.
        for k in kernels:
            assert psutil.Process(k.pid).children(recursive=True) == []
        assert published(tmp_path) == files_before
        # The owner's processes are the ones it started, and its cells run on.
        state = json.loads((tmp_path / f"{NAME}.json").read_text())
        assert {p["pid"] for p in state["processes"]} == engines
        assert owner_cell(state["connection_file"]) == [(0, 2), (1, 2)]

        # Stopped where it runs, the cluster reads as dead to its watchers.
        assert jaxsys("cluster", "stop", "--name", NAME, env=env).returncode == 0
        # The status shown earlier is redrawn by itself.
        assert redrawn_dead(kernels[2]), "the live status was not redrawn"
        status = shown(kernels[0].ok("%jaxsys status"))
        assert process_states(status) == {0: "dead", 1: "dead"}, status
        assert "owner" in status and "gone" in status
        out = kernels[1].ok("%jaxsys unwatch")
        assert f"stopped watching cluster {NAME!r}" in out.stdout
    finally:
        for k in kernels:
            k.shutdown()
        jaxsys("cluster", "stop", "--name", NAME, env=env)


# The owner's cells: its processes record their steps, process 1 is slowed in host code
# before each step, five collective steps run, then the step is compiled again with the
# in-memory caches cleared, so that the persistent cache serves it (process 0; on CPU
# process 1 compiles for itself).
OWNER_SETUP = """\
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxsys_kernel.engine import arrivals
arrivals.enable()
# Every compile is written to the persistent cache, however quick or small.
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
mesh = Mesh(np.array(jax.devices()), ("x",))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), np.ones((4, 8), np.float32))
step = jax.jit(lambda v: jnp.sum(v * 2))
y = step(x)  # compiled: a miss, written to the persistent cache
"""
OWNER_STEPS = """\
jax.clear_caches()
step = jax.jit(lambda v: jnp.sum(v * 2))
for i in range(5):
    y = step(x)
total = float(y)
"""


def owner_runs_steps(connection_file: str) -> None:
    """The owner's cells, sent as a script sends them, p1 slowed by 200 ms in host code."""
    import ipyparallel as ipp

    client = ipp.Client(connection_file)
    try:
        client[:].execute(OWNER_SETUP, block=False).get(timeout=120)
        client[1].execute("arrivals.slow(200, 'host')", block=False).get(timeout=30)
        client[:].execute(OWNER_STEPS, block=False).get(timeout=120)
        assert client[:].pull("total", block=False).get(timeout=30) == [128.0, 128.0]
    finally:
        client.close()


def status_until(kernel: Kernel, condition, timeout: float = 60.0) -> str:
    """The watcher's ``%jaxsys status`` once ``condition(text)`` holds (the owner writes
    its numbers every 2 s, and only while its processes are idle)."""
    deadline = time.monotonic() + timeout
    while True:
        text = shown(kernel.ok("%jaxsys status"))
        if condition(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.5)


def hits(text: str) -> int:
    found = re.search(r"cache \(live, from the owner\): (\d+) hits", text)
    return int(found.group(1)) if found else -1


def test_a_watcher_sees_the_owners_cache_hits_steps_and_straggler(tag, tmp_path):
    env = dict(os.environ, JAXSYS_STATE_DIR=str(tmp_path))
    cache = tmp_path / "cache"
    k = None
    try:
        r = jaxsys(
            "cluster", "start", "--name", NAME, "--hosts", "2", "--devices-per-host", "1",
            "--cache-dir", str(cache), env=env,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        state = json.loads((tmp_path / f"{NAME}.json").read_text())
        k = Kernel(tag, extra_env={"JAXSYS_STATE_DIR": str(tmp_path)})
        k.ok(f"%jaxsys watch {NAME}")
        before = status_until(k, lambda t: hits(t) == 0)
        assert hits(before) == 0 and "steps: not recorded" in before, before

        owner_runs_steps(state["connection_file"])
        after = status_until(k, lambda t: hits(t) > 0 and "straggler: p1 (host)" in t)
        assert hits(after) > 0, after
        assert re.search(r"\[p0\] hits [1-9]", after), after
        assert re.search(r"\b[56] steps", after) and "straggler: p1 (host)" in after, after
        assert re.search(r"step \d+: p1 last by \d+\.\d ms \(host\)", after), after
        assert "stale" not in after
        # %jaxsys cache says the same hits.
        assert "cache (live, from the owner)" in k.ok("%jaxsys cache").stdout
        # The watcher still started nothing and sent the owner nothing it would answer.
        assert psutil.Process(k.pid).children(recursive=True) == []

        # The owner stops writing (stopped, not ended): the watcher says the numbers are stale.
        owner = psutil.Process(state["pid"])
        owner.suspend()
        try:
            stale = status_until(k, lambda t: "stale" in t, timeout=40)
        finally:
            owner.resume()
        assert "stale, written" in stale and "the owner stopped writing" in stale, stale
        assert "straggler: p1 (host)" in stale  # as they were then
    finally:
        if k is not None:
            k.shutdown()
        jaxsys("cluster", "stop", "--name", NAME, env=env)
    # The owner removed its snapshot when it stopped.
    assert not (tmp_path / f"{NAME}.live").exists()
