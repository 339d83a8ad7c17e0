"""A local cluster kept with ``%jaxsys stop --keep-allocation``, through real kernels: its
hosts and options live on a lease (``JAXSYS_LEASE_TTL``, short here). Another kernel
attaches within the TTL and runs a collective; nobody attaching leaves nothing after the
TTL (no process, no directory, and the saved grant said to have lapsed); a kernel killed
while attached frees the hosts for the next kernel, and they lapse a TTL later."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from jaxsys_kernel.cluster.allocation_hosts import lease_file

from ..harness import Kernel, new_tag, tagged_processes, wait_no_processes
from .test_chaos_live import _dirs_of, _gone, _wait

START = "%jaxsys start --hosts 2 --devices-per-host 1 --standby 0"
COLLECTIVE = (
    "%%multihost\nimport jax, jax.numpy as jnp\n"
    "from jax.experimental import multihost_utils as mu\n"
    "print('sum', int(mu.process_allgather(jnp.array([jax.process_index()])).sum()))"
)
TTL_S = 6.0

pytestmark = pytest.mark.timeout(300)


def _kernel(tag: str, state: Path) -> Kernel:
    return Kernel(tag, extra_env={"JAXSYS_STATE_DIR": str(state), "JAXSYS_LEASE_TTL": str(TTL_S)})


def _keep(k: Kernel, state: Path) -> str:
    """Start a cluster in ``k``, keep it; the key its hosts are kept under."""
    k.ok(START, timeout=180)
    out = k.ok("%jaxsys stop --keep-allocation")
    assert "are kept with its options" in out.stdout, out.stdout
    saved = json.loads((state / "kernel-allocation.json").read_text())
    key = saved["allocation"]["job_id"]
    assert key.startswith("local-") and saved["options"]["hosts"] == 2, saved
    return key


def _lease(state: Path, key: str) -> dict:
    os.environ["JAXSYS_STATE_DIR"] = str(state)
    try:
        path = lease_file(key)
    finally:
        del os.environ["JAXSYS_STATE_DIR"]
    return json.loads(path.read_text().splitlines()[1])


def _collective_ok(k: Kernel) -> None:
    out = k.execute(COLLECTIVE, timeout=120)
    assert out.status == "ok", f"{out.error}\n{out.stderr}"
    assert out.stdout == "[p0-1] sum 1\n", out.stdout


def _nothing_left(tag: str, pids: list[int], live: int | None = None) -> None:
    """No process of the tag is left (but the ``live`` kernel), and no directory of the
    kernels ``pids``."""
    if live is None:
        left = wait_no_processes(tag, timeout=15)
    else:
        others = lambda: [p.pid for p in tagged_processes(tag) if p.pid != live]  # noqa: E731
        _wait(lambda: not others(), "no process but the live kernel", 15)
        left = []
    assert not left, f"left behind: {left}"
    for pid in pids:
        if pid != live:
            assert not _dirs_of(pid), _dirs_of(pid)


def test_kept_hosts_are_attached_to_from_another_kernel(tmp_path):
    tag = new_tag()
    a, b = _kernel(tag, tmp_path), None
    pids = [a.pid]
    try:
        key = _keep(a, tmp_path)
        held = _lease(tmp_path, key)
        assert (held["pid"], held["mode"]) == (a.pid, "kept")
        # Kept, not running: every process of the cluster stopped with it.
        _wait(lambda: [p.pid for p in tagged_processes(tag)] == [a.pid], "only the kernel")
        b = _kernel(tag, tmp_path)
        pids.append(b.pid)
        t0 = time.monotonic()
        out = b.execute("%jaxsys attach", timeout=180)
        took = time.monotonic() - t0
        assert out.status == "ok", f"{out.error}\n{out.stderr}"
        print(f"attach to kept local hosts (2 x 1), to a running cluster: {took:.2f} s")
        _collective_ok(b)
        assert _lease(tmp_path, key)["pid"] == b.pid
        assert "kept as local-" in b.ok("%jaxsys status").stdout
        # One kernel at a time: the keeper may not take them back while b runs on them.
        out = a.execute("%jaxsys attach")
        assert out.status == "error"
        assert f"in use by process {b.pid}" in out.error["evalue"], out.error
        assert "%jaxsys stop" in out.error["evalue"]
        # A plain stop gives them back: the saved grant and its lease are gone.
        b.ok("%jaxsys stop")
        assert not (tmp_path / "kernel-allocation.json").exists()
        assert not (tmp_path / "hosts" / f"lease-{key}").exists()
    finally:
        for k in (a, b):
            if k is not None:
                k.shutdown()
    _nothing_left(tag, pids)


def _lease_lapsed(state: Path, key: str) -> bool:
    """Whether the lease on ``key`` is past its expiry (or already removed)."""
    try:
        return time.time() > _lease(state, key)["expires"]
    except FileNotFoundError:
        return True
    except ValueError:  # caught while being rewritten: look again
        return False


def _lapsed_and_forgotten(tag: str, state: Path, key: str, died: float, pids, live=None):
    """Once the lease has lapsed (at most the TTL + 5 s from ``died``): nothing left (but the
    ``live`` kernel), and an attach says the hosts lapsed, then forgets them."""
    _nothing_left(tag, pids, live)
    _wait(
        lambda: _lease_lapsed(state, key),
        "the lease's lapse",
        TTL_S + 5 - (time.monotonic() - died),
    )
    _nothing_left(tag, pids, live)
    c = _kernel(tag, state)
    try:
        out = c.execute("%jaxsys attach")
        assert out.status == "error"
        why = out.error["evalue"]
        assert f"kept as {key}) is gone (its lease lapsed at" in why, why
        assert "%jaxsys start --launcher local" in why
        assert not (state / "kernel-allocation.json").exists()
        assert not (state / "hosts" / f"lease-{key}").exists()
    finally:
        c.shutdown()


def test_kept_hosts_nobody_attaches_to_lapse_and_leave_nothing(tmp_path):
    tag = new_tag()
    a = _kernel(tag, tmp_path)
    pids = [a.pid]
    try:
        key = _keep(a, tmp_path)
        os.kill(a.pid, signal.SIGKILL)
        _wait(lambda: _gone(pids[0]), "the kernel's death")
        _lapsed_and_forgotten(tag, tmp_path, key, time.monotonic(), pids)
    finally:
        a.shutdown()
    _nothing_left(tag, pids)


def test_a_kernel_killed_while_attached_releases_the_hosts_after_the_ttl(tmp_path):
    tag = new_tag()
    a = _kernel(tag, tmp_path)
    pids, b = [a.pid], None
    try:
        key = _keep(a, tmp_path)
        # Attached while the kernel that kept them lives (kept hosts are free for any
        # kernel): a kernel's start may take longer than the short TTL here.
        b = _kernel(tag, tmp_path)
        pids.append(b.pid)
        b.ok("%jaxsys attach", timeout=180)
        assert _lease(tmp_path, key)["mode"] == "run"
        os.kill(b.pid, signal.SIGKILL)
        _wait(lambda: _gone(pids[1]), "the kernel's death")
        # The kernel that kept them still lives: it no longer holds them.
        _lapsed_and_forgotten(tag, tmp_path, key, time.monotonic(), pids, live=pids[0])
    finally:
        for k in (a, b):
            if k is not None:
                k.shutdown()
    _nothing_left(tag, pids)
