"""A Slurm cluster driven from a real jaxsys kernel, as a user drives it: started with
``%jaxsys start --launcher slurm`` on a private Slurm of three namespace hosts
(tests/slurm.py), its processes one per host, its job in ``%jaxsys status``, the hang
doctor's stacks coming back from the hosts, and nothing left (no job in the queue, no
engine on any host) after ``%jaxsys stop`` or after the kernel is killed; and a job kept
with ``%jaxsys stop --keep-allocation`` attached to again after a kernel restart.

The kernel finds this Slurm through ``SLURM_CONF``, which the fixture puts into the
environment every kernel here inherits.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import psutil
import pytest

from .. import netns, slurm
from ..certs import CERT_CELL, assert_one_certificate_per_process
from ..harness import Kernel, status_table, tagged_processes

START = (
    "%jaxsys start --launcher slurm --hosts 3 --devices-per-host 1 "
    "--sbatch-arg=--ntasks-per-node=1 --env JAX_PLATFORMS=cpu"
)
WHERE_CELL = (
    "%%multihost\nimport socket, jax\nprint(jax.process_index(), 'on', socket.gethostname())"
)
# Seconds allowed from a stop (or a death) to an empty queue and no engine on any host.
DRAIN_S = 15.0


@pytest.fixture(scope="module")
def hosts(tag):
    reason = slurm.available()
    if reason:
        pytest.skip(f"no private Slurm here: {reason}")
    with slurm.SlurmHosts(3) as s:
        yield s


def _start(k: Kernel, hosts) -> str:
    out = k.execute(START, timeout=180)
    why = " | ".join(str((out.error or {}).get("evalue")).splitlines())
    assert out.status == "ok", f"start failed: {why}\n{out.stderr}\n{hosts.log_tail()}"
    (job_id,) = [q.split()[0] for q in hosts.queue()]
    return job_id


def _nothing_left(hosts, tag: str, kernel: Kernel) -> float:
    """Seconds until the queue is empty and no tagged process but the kernel (engines,
    nannies, srun, the job's watchdog) is left here or on any host; fails after
    :data:`DRAIN_S`."""
    t0 = time.monotonic()
    hosts.wait_queue_empty(DRAIN_S)
    # The kernel's pid, while it has one (not after its shutdown).
    kernel_pid = getattr(getattr(kernel.km.provisioner, "process", None), "pid", None)

    def left() -> list[str]:
        return [
            f"{p.pid} {' '.join(p.cmdline())[:150]}"
            for p in tagged_processes(tag)
            if p.pid != kernel_pid
        ] + [f"{pid} on a host" for pid in hosts.namespace_pids()]

    while left() and time.monotonic() - t0 < DRAIN_S:
        time.sleep(0.1)
    assert not left(), f"left behind: {left()}"
    return time.monotonic() - t0


def _engines_on(hosts, i: int) -> int:
    """Live engines (not their nannies) on host ``i``."""
    n = 0
    for pid in netns.namespace_pids(hosts.hosts.namespaces[i]):
        try:
            p = psutil.Process(pid)
            cmd = " ".join(p.cmdline())
            if p.status() != psutil.STATUS_ZOMBIE and "ipyparallel.engine" in cmd:
                n += "nanny" not in cmd
        except psutil.Error:
            pass
    return n


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout:g} s"
        time.sleep(0.1)


def test_a_slurm_cluster_from_the_kernel(hosts, tag):
    k = Kernel(tag)
    try:
        job_id = _start(k, hosts)
        # Process i runs on host i.
        out = k.ok(WHERE_CELL)
        assert out.stdout == "".join(f"[p{i}] {i} on host{i}\n" for i in range(3)), out.stdout
        status = k.ok("%jaxsys status").stdout
        assert f"job {job_id}: running on host0,host1,host2" in status, status
        rows = status_table(status)
        assert [rows[i]["host"] for i in range(3)] == hosts.node_names, status
        assert [rows[i]["state"] for i in range(3)] == ["ready"] * 3, status
        assert re.search(r"^security: .*mTLS", status, re.M), status
        assert_one_certificate_per_process(k.ok("%%multihost" + CERT_CELL).stdout, 3)
        # The hang doctor: a cell past its timeout shows where each process is, read
        # from processes on other hosts (their stacks come back over telemetry).
        out = k.execute("%%multihost --timeout 1.5\nimport time\ntime.sleep(30)", timeout=60)
        assert out.status == "error" and out.error["ename"] == "MultihostTimeout", out.error
        assert "passed its timeout of 1.5 s" in out.stderr
        assert ">> " in out.stderr and "time.sleep(30)" in out.stderr, out.stderr
        assert k.ok("%%multihost\nprint('fine')").stdout == "[p0-2] fine\n"
        # Killing one process (through its nanny, on its host) leaves the others running.
        k.ok("%jaxsys kill 1")
        rows = status_table(k.ok("%jaxsys status").stdout)
        assert [rows[i]["state"] for i in range(3)] == ["ready", "dead", "ready"], rows
        _wait(lambda: _engines_on(hosts, 1) == 0, 10, "no engine on host1")
        assert _engines_on(hosts, 0) == _engines_on(hosts, 2) == 1
        # It cannot be started again inside the running job step: refused, saying so.
        out = k.execute("%jaxsys restart 1")
        assert out.status == "error"
        assert (
            "the slurm launcher cannot restart a single process" in out.error["evalue"]
            and "restart the whole world" in out.error["evalue"]
        ), out.error
        k.ok("%jaxsys stop")
        took = _nothing_left(hosts, tag, k)
        assert took < DRAIN_S
    finally:
        k.shutdown()


def test_killing_the_kernel_cancels_the_job(hosts, tag):
    k = Kernel(tag)
    try:
        _start(k, hosts)
        assert len(tagged_processes(tag)) > 3  # the engines, their nannies, srun...
        os.kill(k.pid, signal.SIGKILL)
        took = _nothing_left(hosts, tag, k)
        assert took < DRAIN_S
    finally:
        k.shutdown()


def test_a_kept_job_is_attached_to_again_after_a_kernel_restart(hosts, tag, tmp_path):
    k = Kernel(tag, extra_env={"JAXSYS_STATE_DIR": str(tmp_path)})
    job_id = None
    try:
        job_id = _start(k, hosts)
        out = k.ok("%jaxsys stop --keep-allocation")
        assert f"Slurm job {job_id} is kept" in out.stdout, out.stdout
        _wait(lambda: sum(_engines_on(hosts, i) for i in range(3)) == 0, 10, "engines gone")
        # A restart ends the kernel (and what it started): the job stays, alone in the queue.
        k.km.restart_kernel(now=False)
        k.kc.wait_for_ready(timeout=60)
        assert hosts.queue() == [f"{job_id} RUNNING"]
        out = k.execute("%jaxsys attach", timeout=180)
        assert out.status == "ok", f"{out.error}\n{out.stderr}\n{hosts.log_tail()}"
        # The engines run in the same job, on its three nodes, and nothing else was queued.
        out = k.ok(WHERE_CELL)
        assert out.stdout == "".join(f"[p{i}] {i} on host{i}\n" for i in range(3)), out.stdout
        assert hosts.queue() == [f"{job_id} RUNNING"]
        assert f"job {job_id}: running on host0,host1,host2" in k.ok("%jaxsys status").stdout
        out = k.ok("%jaxsys stop")
        assert f"Slurm job {job_id} keeps running" in out.stdout, out.stdout
    finally:
        if job_id is not None:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=20, check=False)
        k.shutdown()
    _nothing_left(hosts, tag, k)
    # An ended job is no attach: said, and forgotten.
    k = Kernel(tag, extra_env={"JAXSYS_STATE_DIR": str(tmp_path)})
    try:
        out = k.execute("%jaxsys attach")
        assert out.status == "error"
        assert f"the saved Slurm job {job_id} is" in out.error["evalue"], out.error
        assert "%jaxsys start" in out.error["evalue"]
    finally:
        k.shutdown()


# A short lease, so that a kept job whose kernel was killed lapses within the test.
TTL_S = 6.0


@pytest.mark.parametrize("watchdog", ["lives", "killed"])
def test_a_kept_job_goes_when_its_kernels_lease_lapses(hosts, tag, tmp_path, watchdog):
    k = Kernel(tag, extra_env={"JAXSYS_STATE_DIR": str(tmp_path), "JAXSYS_LEASE_TTL": str(TTL_S)})
    try:
        job_id = _start(k, hosts)
        out = k.ok("%jaxsys stop --keep-allocation")
        assert f"Slurm job {job_id} is kept" in out.stdout, out.stdout
        lease = tmp_path / "slurm" / f"lease-{job_id}"
        held = json.loads(lease.read_text().splitlines()[1])
        assert (held["pid"], held["mode"], held["owned"]) == (k.pid, "kept", True)
        if watchdog == "killed":
            # As when the Lab's job the kernel ran in ends: its watchdog goes with it, and
            # the job's own batch script must see the lease lapse.
            os.kill(held["watchdog_pid"], signal.SIGKILL)
        os.kill(k.pid, signal.SIGKILL)
        t0 = time.monotonic()
        hosts.wait_queue_empty(TTL_S + 30)
        took = time.monotonic() - t0
        print(f"kernel SIGKILL to no job ({watchdog} watchdog): {took:.1f} s, TTL {TTL_S:g} s")
        assert took < TTL_S + 30
    finally:
        k.shutdown()
    _nothing_left(hosts, tag, k)
