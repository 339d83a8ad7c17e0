"""Clusters in a real Slurm job: a private slurmctld here and one slurmd in each of three
network-namespace hosts (tests/slurm.py), so process i runs on host i and the job's
state, reason and end are Slurm's own."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from jaxsys_kernel import Cluster
from jaxsys_kernel.cluster.slurm_watch import BACKOFF_MAX_S

from .. import slurm
from ..certs import CERT_CELL, assert_one_certificate_per_process
from ..harness import run_on

SUM_CELL = """
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((jax.device_count(),), ('x',))
local = np.full((jax.local_device_count(),), jax.process_index() + 1.0, np.float32)
arr = jax.make_array_from_process_local_data(NamedSharding(mesh, P('x')), local)
print('total', float(jax.jit(lambda a: a.sum())(arr)), 'devices', jax.device_count())
"""
# Seconds allowed from a stop (or a death) to an empty queue and no process on the hosts.
DRAIN_S = 15.0


@pytest.fixture(scope="module")
def hosts():
    reason = slurm.available()
    if reason:
        pytest.skip(f"no private Slurm here: {reason}")
    with slurm.SlurmHosts(3) as s:
        yield s


def _cluster(progress=None, *sbatch_args: str) -> Cluster:
    return Cluster(
        hosts=3,
        devices_per_host=1,
        launcher="slurm",
        env={"JAX_PLATFORMS": "cpu"},
        launcher_options={"sbatch_args": ["--ntasks-per-node=1", *sbatch_args]},
        progress=progress or (lambda e: None),
    )


def _wait(condition, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what} not within {timeout:g} s")
        time.sleep(0.1)
    return time.monotonic() - t0


def _drained(hosts) -> float:
    """Seconds until the queue is empty and no job process is left on any host."""
    took = hosts.wait_queue_empty(DRAIN_S)
    return took + _wait(lambda: hosts.namespace_pids() == [], DRAIN_S, "no process on the hosts")


def _only_line(out: str) -> str:
    lines = {line.split("] ", 1)[1] for line in out.splitlines()}
    assert len(lines) == 1, out
    return lines.pop()


def test_a_slurm_cluster_spans_the_hosts_and_leaves_nothing(hosts):
    events = []
    c = _cluster(events.append)
    try:
        try:
            c.start_sync()
        except Exception as e:
            raise AssertionError(f"{e}\n{hosts.log_tail()}") from e
        job = c.job()
        assert job["nodes"] == hosts.node_names
        assert job["state"] == f"running on {','.join(hosts.node_names)}"
        # Process i runs on host i, and process 0's node serves the coordinator.
        assert [p["host"] for p in c.status()] == hosts.node_names
        assert [p["address"] for p in c.status()] == hosts.hosts.host_addresses
        assert c.coordinator_address.startswith(hosts.hosts.host_addresses[0] + ":")
        assert _only_line(run_on(c, SUM_CELL)) == "total 6.0 devices 3"
        # One environment for every rank, and still a certificate of its own for each.
        assert_one_certificate_per_process(run_on(c, CERT_CELL), 3)
        # The batch script is in the cluster's profile, never in the working directory.
        assert (c.world.profile / "jaxsys-allocation.sbatch").is_file()
        assert not os.path.exists("jaxsys-allocation.sbatch")
        assert [q.split()[0] for q in hosts.queue()] == [job["job_id"]]
        # A world restart runs new engines in the same job: nothing is queued again.
        c.restart_sync()
        assert c.job()["job_id"] == job["job_id"]
        assert _only_line(run_on(c, SUM_CELL)) == "total 6.0 devices 3"
    finally:
        c.kill()
    assert _drained(hosts) < DRAIN_S


def test_a_held_job_shows_its_reason_then_runs(hosts):
    events = []
    c = _cluster(events.append, "--hold")
    failure = []

    def start():
        try:
            c.start_sync()
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            failure.append(e)

    t = threading.Thread(target=start)
    t.start()
    try:
        # Held by its owner (JobHeldUser), or by an administrator when that is root.
        _wait(lambda: any("pending (JobHeld" in e.stage for e in events), 30, "held")
        job_id = c.job()["job_id"]
        # The registration clock has not started: hold it for longer than a poll or two.
        subprocess.run(["scontrol", "release", job_id], check=True, timeout=10)
        t.join(120)
        assert not failure, failure
        stages = [e.stage for e in events]
        held = next(
            i for i, s in enumerate(stages) if s.startswith(f"Slurm job {job_id} pending (JobHeld")
        )
        running = next(
            i for i, s in enumerate(stages) if s.startswith(f"Slurm job {job_id} running")
        )
        assert held < running < stages.index("engines registered")
        assert c.state == "ready"
    finally:
        t.join(120)
        c.kill()
    _drained(hosts)


def test_a_job_cancelled_from_outside_is_reported(hosts):
    c = _cluster()
    try:
        c.start_sync()
        job_id = c.job()["job_id"]
        subprocess.run(["scancel", job_id], check=True, timeout=10)
        _wait(
            lambda: all(p["state"] == "dead" for p in c.status()),
            DRAIN_S,
            "every process dead",
        )
        assert f"Slurm job {job_id} ended: " in c.processes[0].died
        assert c.job()["state"].startswith(("cancelled", "completing", "gone"))
    finally:
        c.kill()
    _drained(hosts)


def _owner(tmp_path) -> subprocess.Popen:
    """A process that owns a Slurm cluster (``jaxsys cluster start``, as a kernel does),
    once its cluster is ready."""
    env = {**os.environ, "JAXSYS_STATE_DIR": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    owner = subprocess.Popen(
        [sys.executable, "-m", "jaxsys_kernel.cli", "cluster", "start", "--foreground",
         "--launcher", "slurm", "--hosts", "3", "--devices-per-host", "1", "--name", "dies"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    state_file = tmp_path / "dies.json"

    def ready() -> bool:
        assert owner.poll() is None, "jaxsys cluster start exited"
        try:
            return json.loads(state_file.read_text()).get("state") == "ready"
        except (OSError, ValueError):
            return False

    try:
        _wait(ready, 120, "the cluster ready")
    except BaseException:
        _kill(owner)
        raise
    return owner


def _kill(owner: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(owner.pid, signal.SIGKILL)
    owner.wait(10)


def test_the_job_goes_when_its_owner_dies(hosts, tmp_path):
    # The owner is killed without any teardown: its watchdog cancels the job.
    owner = _owner(tmp_path)
    try:
        assert len(hosts.queue()) == 1
    finally:
        _kill(owner)
    assert _drained(hosts) < DRAIN_S


def _watchdog(job_id: str, owner: int) -> psutil.Process:
    """The watchdog of ``job_id`` that watches process ``owner``."""
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        want = ["--job", job_id, "--pid", str(owner)]
        if "--job" in cmd and cmd[cmd.index("--job") :][:4] == want:
            return p
    raise AssertionError(f"no watchdog for job {job_id}")


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _log_says(p: psutil.Process, words: str) -> bool:
    """Whether the watchdog ``p`` has logged ``words``, or is gone."""
    try:
        cmd = p.cmdline()
    except psutil.Error:
        return True
    if "--log" not in cmd:
        return not _running(p)
    log = Path(cmd[cmd.index("--log") + 1])
    return log.is_file() and words in log.read_text()


def test_the_job_goes_when_its_owner_dies_while_slurmctld_is_down(hosts, tmp_path):
    owner = _owner(tmp_path)
    try:
        ((job_id, _),) = [q.split() for q in hosts.queue()]
        watchdog = _watchdog(job_id, owner.pid)
        hosts.stop_controller()
        try:
            # squeue fails ("Unable to contact slurm controller"): no proof the job left.
            _wait(lambda: _log_says(watchdog, "squeue got no answer"), 60, "a failed squeue")
            assert _running(watchdog), "the watchdog gave up on a failing squeue"
            _kill(owner)
            _wait(lambda: _log_says(watchdog, "scancel"), 60, "a failed scancel")
            assert _running(watchdog)
        finally:
            hosts.start_controller()
    finally:
        _kill(owner)
    # The next try after slurmctld is back cancels the job.
    assert _drained(hosts) < DRAIN_S + BACKOFF_MAX_S


def _steps(job_id: str) -> list[str]:
    r = subprocess.run(
        ["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    steps = (line.strip() for line in r.stdout.splitlines())
    return sorted(s for s in steps if s and not s.endswith((" batch", " extern")))


def test_the_users_own_step_outlives_a_cluster_attached_to_its_job(hosts, tmp_path):
    # The user's job runs a long step of its own (as a Lab's job runs jupyterhub-singleuser).
    script = tmp_path / "mine.sbatch"
    script.write_text(
        "#!/bin/sh\n#SBATCH --ntasks=3\n#SBATCH --ntasks-per-node=1\n"
        f"#SBATCH --output={tmp_path}/mine.out\n"
        "srun --overlap --ntasks=1 --job-name=mine sleep 600\n"
    )
    r = subprocess.run(
        ["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=20
    )
    job_id = r.stdout.strip().split(";")[0]
    assert r.returncode == 0 and job_id, r.stderr
    try:
        _wait(lambda: f"{job_id}.0 mine" in _steps(job_id), 60, "the user's step running")
        c = Cluster(
            hosts=3,
            devices_per_host=1,
            launcher="slurm",
            env={"JAX_PLATFORMS": "cpu"},
            launcher_options={"job_id": job_id},
        )
        try:
            c.start_sync()
            assert _only_line(run_on(c, SUM_CELL)) == "total 6.0 devices 3"
            c.restart_sync()  # kills the engines' step, and only it
            assert f"{job_id}.0 mine" in _steps(job_id)
            assert _only_line(run_on(c, SUM_CELL)) == "total 6.0 devices 3"
        finally:
            c.kill()
        _wait(lambda: _steps(job_id) == [f"{job_id}.0 mine"], DRAIN_S, "only the user's step")
        assert hosts.queue() == [f"{job_id} RUNNING"]
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=20, check=False)
    _drained(hosts)


ENV_CELL = """
import os
print(os.environ.get('SLURM_EXPORT_ENV'), os.environ.get('SLURM_CPUS_PER_TASK'),
      os.environ.get('JAXSYS_MINE'), 'IPP_CLUSTER_ID' in os.environ)
"""


@pytest.mark.parametrize("export", ["NONE", "PATH,HOME"])
def test_a_cluster_starts_from_inside_a_job_submitted_with_an_export(hosts, monkeypatch, export):
    # What a JupyterLab that Open OnDemand (--export=NONE) or batchspawner (an export list)
    # submitted finds in its environment: Slurm's commands would read them as options.
    monkeypatch.setenv("SLURM_EXPORT_ENV", export)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    monkeypatch.setenv("SBATCH_EXPORT", export)
    c = Cluster(
        hosts=3,
        devices_per_host=1,
        launcher="slurm",
        env={"JAX_PLATFORMS": "cpu", "JAXSYS_MINE": "yes"},
        launcher_options={"sbatch_args": ["--ntasks-per-node=1"]},
        progress=lambda e: None,
    )
    try:
        try:
            c.start_sync()
        except Exception as e:
            raise AssertionError(f"{e}\n{hosts.log_tail()}") from e
        assert _only_line(run_on(c, SUM_CELL)) == "total 6.0 devices 3"
        assert _only_line(run_on(c, ENV_CELL)) == "None None yes True"
    finally:
        c.kill()
    _drained(hosts)
