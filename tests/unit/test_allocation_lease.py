"""Leases of kept allocations: renewed by their holder, lapsed a TTL after the last renewal
or at once when a "run" holder is gone, taken by one live process at a time (another is
told who holds it), written whole and privately; and the watchdog that reads them."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import time

import pytest

from jaxsys_kernel.cluster import lease as leases
from jaxsys_kernel.cluster import slurm_watch
from jaxsys_kernel.cluster.allocation_slurm import batch_script


def _no_such_pid() -> int:
    return next(p for p in range(4_000_000, 3_000_000, -1) if not os.path.exists(f"/proc/{p}"))


def _held_by(path, pid: int, host: str, expires: float, mode: str = leases.RUN) -> None:
    state = leases.LeaseState(expires, pid, None, host, 30.0, mode)
    leases.write_private(path, f"{int(expires)}\n{json.dumps(state.__dict__)}\n")


def test_a_lease_is_private_whole_and_readable_by_sh(tmp_path):
    path = tmp_path / "leases" / "lease-12"
    lease = leases.Lease(path, "Slurm job 12")
    state = lease.acquire(owned=True, ttl=30)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    first = path.read_text().splitlines()[0]
    assert first == str(int(state.expires)) and abs(int(first) - (time.time() + 30)) < 2
    assert [p.name for p in path.parent.iterdir()] == ["lease-12"]  # no temporary left
    read = leases.read(path)
    assert (read.pid, read.host, read.owned, read.mode) == (
        os.getpid(),
        socket.gethostname(),
        True,
        leases.RUN,
    )


def test_renewing_pushes_the_expiry_and_stops_when_another_took_it(tmp_path):
    path = tmp_path / "lease-12"
    lease = leases.Lease(path, "Slurm job 12")
    lease.acquire(owned=True, ttl=30)
    lease.state.expires = time.time() - 1  # as if it had not been renewed for a while
    assert lease.renew()
    assert not leases.read(path).lapsed()
    _held_by(path, _no_such_pid(), socket.gethostname(), time.time() + 30)
    assert not lease.renew()  # another process's now: left alone
    assert leases.read(path).pid != os.getpid()


def test_a_second_live_holder_is_refused_by_name(tmp_path):
    path = tmp_path / "lease-12"
    # Another process on another host, its lease not lapsed: refused, naming it.
    _held_by(path, 4321, "nodeA", time.time() + 30)
    with pytest.raises(
        leases.LeaseHeldError, match=r"Slurm job 12 is in use by process 4321 on nodeA"
    ):
        leases.Lease(path, "Slurm job 12").acquire(owned=False)
    # Lapsed: taken over.
    _held_by(path, 4321, "nodeA", time.time() - 1)
    assert leases.Lease(path, "Slurm job 12").acquire(owned=False).pid == os.getpid()
    # Held on this host by a process that is gone: taken over before its lease lapses.
    _held_by(path, _no_such_pid(), socket.gethostname(), time.time() + 30, leases.KEPT)
    assert leases.refusal(path, "Slurm job 12") is None
    # Held by this process: taken again (a restart in the same kernel).
    assert leases.refusal(path, "Slurm job 12") is None


def test_an_earlier_holders_ownership_carries_over(tmp_path):
    path = tmp_path / "lease-12"
    _held_by(path, _no_such_pid(), socket.gethostname(), time.time() + 30, leases.KEPT)
    # The earlier holder submitted the job (owned): an attach by id keeps it cancellable.
    assert leases.Lease(path, "Slurm job 12").acquire(owned=False).owned is True


def test_releasing_removes_only_ones_own_lease(tmp_path):
    path = tmp_path / "lease-12"
    lease = leases.Lease(path, "Slurm job 12")
    lease.acquire(owned=True)
    lease.release()
    assert not path.exists()
    lease = leases.Lease(path, "Slurm job 12")
    lease.acquire(owned=True)
    _held_by(path, 4321, "nodeA", time.time() + 30)
    lease.release()
    assert leases.read(path).pid == 4321


def test_the_ttl_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(leases.TTL_VAR, "6")
    assert leases.ttl_s() == 6
    monkeypatch.setenv(leases.TTL_VAR, "1")
    assert leases.ttl_s() == 3  # never shorter than a few renewals
    monkeypatch.setenv(leases.TTL_VAR, "soon")
    assert leases.ttl_s() == leases.DEFAULT_TTL_S


@pytest.fixture
def slurm(monkeypatch):
    calls: list[list[str]] = []

    def run(argv, **kwargs):
        calls.append(argv)
        out = "RUNNING\n" if argv[0] == "squeue" and "-s" not in argv else ""
        if argv[0] == "squeue" and "-s" in argv:
            out = f"12.0 {slurm_watch.STEP_NAME}\n12.1 mine\n"
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(slurm_watch.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(slurm_watch.subprocess, "run", run)
    monkeypatch.setattr(slurm_watch, "WATCH_PID_S", 0.001)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return calls


def _watch(tmp_path, owned=True) -> int:
    log = slurm_watch.Log(tmp_path / "w.log")
    return slurm_watch.watch("12", os.getpid(), None, log, tmp_path / "lease-12", owned)


def test_the_watchdog_cancels_a_lapsed_lease_of_a_job_jaxsys_submitted(slurm, tmp_path):
    _held_by(tmp_path / "lease-12", 4321, "nodeA", time.time() - 1, leases.KEPT)
    assert _watch(tmp_path) == 0
    assert ["scancel", "12"] in slurm
    assert not (tmp_path / "lease-12").exists()


def test_in_a_job_of_the_users_a_lapse_ends_only_jaxsys_steps(slurm, tmp_path):
    _held_by(tmp_path / "lease-12", 4321, "nodeA", time.time() - 1, leases.KEPT)
    assert _watch(tmp_path, owned=False) == 0
    scancels = [c for c in slurm if c[0] == "scancel"]
    assert scancels == [["scancel", "-s", "KILL", "12.0"]]


def test_a_run_lease_ends_with_its_holder_and_a_kept_one_waits_for_its_ttl(
    slurm, tmp_path, monkeypatch
):
    _held_by(tmp_path / "lease-12", _no_such_pid(), socket.gethostname(), time.time() + 30)
    assert _watch(tmp_path) == 0
    assert ["scancel", "12"] in slurm
    # Kept: the dead holder's lease still runs, so a later kernel may attach; the watchdog
    # waits (here: until the lease is given back).
    slurm.clear()
    _held_by(
        tmp_path / "lease-12", _no_such_pid(), socket.gethostname(), time.time() + 30, leases.KEPT
    )
    looks = []

    def read(path):
        looks.append(path)
        if len(looks) > 5:
            return None  # given back by a later holder
        return leases.LeaseState(
            time.time() + 30, _no_such_pid(), None, socket.gethostname(), 30, leases.KEPT
        )

    monkeypatch.setattr(slurm_watch.leases, "read", read)
    assert _watch(tmp_path) == 0
    assert not [c for c in slurm if c[0] == "scancel"]


def test_the_batch_script_ends_when_its_lease_lapses(tmp_path, monkeypatch):
    monkeypatch.setenv(leases.TTL_VAR, "6")
    text = batch_script("j", 2, {}, tmp_path / "out", tmp_path / "leases")
    assert "sleep 3600" not in text
    assert f"lease={tmp_path}/leases/lease-$SLURM_JOB_ID" in text
    assert "sleep 2 & wait $!" in text
    # Without a lease directory, the job holds until it is cancelled.
    assert "sleep 3600" in batch_script("j", 2, {}, tmp_path / "out")
