"""Read-only watchers: three kernels watch a cluster that ``jaxsys cluster start`` owns; they
see its processes, are refused cells, stop and restart, start nothing and write nothing,
and the owner's cells run on."""

from __future__ import annotations

import json
import os
import queue
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
        files_before = sorted(p.name for p in tmp_path.iterdir())
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
        assert sorted(p.name for p in tmp_path.iterdir()) == files_before
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
