"""jaxsys in a JupyterLab that JupyterHub (batchspawner) started as a Slurm job, as a user
drives it: over the hub's REST API, the Lab's REST API and a kernel's websocket, as a real
user made with ``useradd`` (tests/hub.py), on the suite's private Slurm.

A cluster is started and computes inside the Lab's job (local launcher, ``--launcher
slurm``, attached to the Lab's own job); stopping it leaves the Lab alive; stopping the Lab
through the hub or killing the kernel leaves no job, no process and no key directory; the
other user is refused; and the hub's batchspawner callback (jaxsys's shipped configuration)
takes a port and nothing else, so a user's ``batch_query_cmd`` never runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import requests

from .. import hub as labhub
from ..hub import LabHub, LabKernel, user_pids, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SUM_CELL = (
    "%%multihost\nimport jax, numpy as np\nfrom jax.experimental import multihost_utils as mu\n"
    "g = mu.process_allgather(np.array([jax.process_index() + 1.0]))\n"
    "print('sum', float(g.sum()), 'of', jax.process_count())"
)
# What the 2 processes print after SUM_CELL (the same line from both, shown once).
SUM_LINE = "[p0-1] sum 3.0 of 2"
# Seconds allowed from a stop or a kill to no job, no process and no key directory.
DRAIN_S = 60.0


@pytest.fixture(scope="module")
def hub():
    reason = labhub.available()
    if reason:
        pytest.skip(f"no JupyterHub on Slurm here: {reason}")
    with LabHub() as h:
        yield h


@pytest.fixture(scope="module")
def alice(hub):
    return hub.users[0]


@pytest.fixture(scope="module")
def alice_token(hub, alice):
    return hub.user_token(alice)


def _kernel_pids(user: str) -> list[int]:
    found = []
    for pid in user_pids(user):
        try:
            if (
                "jaxsys_kernel" in " ".join(psutil.Process(pid).cmdline())
                and "-f" in psutil.Process(pid).cmdline()
            ):
                found.append(pid)
        except psutil.Error:
            continue
    return found


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())[:200]
    except psutil.Error:
        return f"{pid} (gone)"


def _key_dirs(user: str) -> list[Path]:
    """jaxsys profile directories (keys, certificates) of ``user`` in the node's temp dir."""
    import pwd

    uid = pwd.getpwnam(user).pw_uid
    out = []
    for p in Path(tempfile.gettempdir()).glob("jaxsys-profile-*"):
        try:
            if p.stat().st_uid == uid:
                out.append(p)
        except OSError:
            continue
    return out


def _assert_sum(text: str) -> None:
    assert SUM_LINE in text, f"expected {SUM_LINE!r} from both processes:\n{text}"


def _nothing_left(hub: LabHub, user: str) -> dict[str, float]:
    """Seconds until ``user`` has no job, no process and no key directory left; each wait
    fails after :data:`DRAIN_S`."""
    t0, took = time.monotonic(), {}
    wait_for(lambda: not hub.job_of(user), DRAIN_S, f"{user}'s jobs gone: {hub.job_of(user)}")
    took["jobs"] = time.monotonic() - t0
    wait_for(lambda: not user_pids(user), DRAIN_S,
             f"{user}'s processes gone: {[_cmdline(p) for p in user_pids(user)]}")  # fmt: skip
    took["processes"] = time.monotonic() - t0
    wait_for(lambda: not _key_dirs(user), DRAIN_S, f"key directories gone: {_key_dirs(user)}")
    took["keys"] = time.monotonic() - t0
    print(f"nothing of {user} left: " + ", ".join(f"{k} {v:.1f} s" for k, v in took.items()))
    return took


def test_the_lab_serves_and_lists_the_jaxsys_kernel_to_its_user(hub, alice, alice_token):
    hub.ensure_server(alice)
    (job,) = hub.job_of(alice)
    assert job.endswith("RUNNING"), job
    h = {"Authorization": f"token {alice_token}"}
    specs = requests.get(f"{hub.url}/user/{alice}/api/kernelspecs", headers=h, timeout=30)
    assert specs.status_code == 200, specs.text
    assert "jaxsys" in specs.json()["kernelspecs"], sorted(specs.json()["kernelspecs"])
    lab = requests.get(f"{hub.url}/user/{alice}/lab", headers=h, timeout=30)
    assert lab.status_code == 200


def test_the_callback_takes_a_port_only_and_runs_nothing_a_user_sends(hub, alice):
    hub.ensure_server(alice)
    token = hub.server_token(alice)
    marker = hub.dir / "escalated"
    url = f"{hub.url}/hub/api/batchspawner"
    h = {"Authorization": f"token {token}"}
    polls = hub.hub_log().count("Spawner querying job")
    evil = {"batch_query_cmd": f"true; touch {marker}; squeue -h -j {{job_id}} -o '%T %B'"}
    r = requests.post(url, json=evil, headers=h, timeout=30)
    assert r.status_code == 400 and "batch_query_cmd" in r.text, (r.status_code, r.text)
    r = requests.post(url, json={"port": 1, "exec_prefix": "true;"}, headers=h, timeout=30)
    assert r.status_code == 400, (r.status_code, r.text)
    # A running server reported its port already: a second report is refused.
    r = requests.post(url, json={"port": 1}, headers=h, timeout=30)
    assert r.status_code == 409, (r.status_code, r.text)
    # Unauthenticated: refused before anything is read.
    assert requests.post(url, json={"port": 1}, timeout=30).status_code == 403
    # Two polls of the job after the requests ran the hub's own query, not the user's.
    wait_for(lambda: hub.hub_log().count("Spawner querying job") >= polls + 2, 30,
             "two polls of the job")  # fmt: skip
    queries = hub.hub_log().split("Spawner querying job")[polls + 1 :]
    assert not any("touch" in q.splitlines()[0] for q in queries), queries
    assert not marker.exists()
    assert hub.server(alice)["ready"]


def test_a_cluster_in_the_lab_computes_and_the_other_user_is_refused(hub, alice, alice_token):
    hub.ensure_server(alice)
    k = LabKernel(hub, alice, alice_token)
    try:
        out = k.ok("%jaxsys start --hosts 2 --devices-per-host 1", timeout=180)
        assert "ready" in out, out
        _assert_sum(k.ok(SUM_CELL))
        job = hub.job_of(alice)[0].split()[0]
        status = k.ok("%jaxsys status")
        assert f"kernel: in Slurm job {job} (2 CPUs on host0)" in status, status
        assert "share its" not in status, status
        _a_shared_node_is_said(hub, k)
        # The other user: refused by alice's Lab with his own token.
        bob_token = hub.user_token(hub.users[1])
        r = requests.get(f"{hub.url}/user/{alice}/api/kernels",
                         headers={"Authorization": f"token {bob_token}"}, timeout=30)  # fmt: skip
        assert r.status_code == 403, (r.status_code, r.text)
        _bob_is_refused_by_the_cluster(hub, k)
        k.ok("%jaxsys stop")
    finally:
        k.close()


def _a_shared_node_is_said(hub: LabHub, k: LabKernel) -> None:
    bob = hub.users[1]
    assert "shared node" not in k.ok("%jaxsys security")
    env = {**os.environ, **hub.slurm.env}
    sleeper = subprocess.Popen(["runuser", "-u", bob, "--", "srun", "-n1", "-c1", "--chdir=/tmp",
                                "sleep", "120"], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_for(lambda: any(j.endswith("RUNNING") for j in hub.job_of(bob)), 30, "bob's job")
        security = k.ok("%jaxsys security")
        assert f"shared node: other users' jobs may run on host0 ({bob})" in security, security
        assert "--exclusive" in security
    finally:
        subprocess.run(["scancel", "-u", bob], env=env, timeout=30, check=False)
        sleeper.kill()
        sleeper.wait(30)


# Run as the other user in a job of his own on the Lab's node: a TLS client without a
# certificate at the coordinator (refused: closed), and each CurveZMQ port's own greeting
# (it demands CURVE, whose keys the other user lacks).
BOB_PROBE = """
import json, sys
from tests.intruders import knock, zmtp_mechanism
out = {}
for e in json.loads(sys.argv[1]):
    host, port = e["address"].rsplit(":", 1)
    mtls = e["protection"] == "mTLS"
    out[e["address"]] = knock(e["address"], "tls-no-cert").outcome if mtls else zmtp_mechanism(host, int(port))
print(json.dumps(out))
"""
AUDIT = (
    "import json\nfrom jaxsys_kernel.cluster.audit import audit\n"
    "print(json.dumps([e.to_dict() for e in audit(get_ipython()._jaxsys_session.cluster)]))"
)


def _bob_is_refused_by_the_cluster(hub: LabHub, k: LabKernel) -> None:
    ends = [e for e in json.loads(k.ok(AUDIT)) if e["protection"] in ("mTLS", "CurveZMQ")]
    assert any(e["protection"] == "mTLS" for e in ends), ends
    bob = hub.users[1]
    r = subprocess.run(
        ["runuser", "-u", bob, "--", "env", f"SLURM_CONF={hub.slurm.env['SLURM_CONF']}",
         f"PYTHONPATH={labhub.ROOT}", "srun", "-n1", "-c1", "--chdir=/tmp", sys.executable,
         "-c", BOB_PROBE, json.dumps(ends)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    for e in ends:
        expected = "closed" if e["protection"] == "mTLS" else "CURVE"
        assert seen[e["address"]] == expected, (e, seen[e["address"]])
    security = k.ok("%jaxsys security")
    assert "refused connections to the JAX coordination service" in security, security


def test_a_killed_kernel_leaves_no_process_and_no_keys(hub, alice, alice_token):
    hub.ensure_server(alice)
    before = set(user_pids(alice))
    k = LabKernel(hub, alice, alice_token)
    try:
        # No standby processes: one that is booting when the kernel dies is another case.
        k.ok("%jaxsys start --hosts 3 --devices-per-host 1 --standby 0", timeout=180)
        status = k.ok("%jaxsys status")
        assert "3 processes x 1 devices run on this node and share its 2 CPUs" in status, status
        (kernel_pid,) = _kernel_pids(alice)
        keys = _key_dirs(alice)
        assert keys, "no profile directory while the cluster runs"
        # The kernel and its cluster (controller, engines, nannies); the Lab restarts a dead
        # kernel, a new process that is no part of the killed one's cluster.
        cluster = set(user_pids(alice)) - before
        assert len(cluster) >= 4, cluster
        psutil.Process(kernel_pid).kill()

        def left() -> list[str]:
            return [_cmdline(p) for p in user_pids(alice) if p in cluster]

        wait_for(lambda: not left(), DRAIN_S, f"the killed kernel's processes gone: {left()}")
        wait_for(
            lambda: not any(d.exists() for d in keys), DRAIN_S, f"its key directories gone: {keys}"
        )
    finally:
        k.ws.close()
    assert hub.server(alice)["ready"]


def test_a_hub_killed_and_restarted_finds_the_lab_and_its_cluster_computing(
    hub, alice, alice_token
):
    hub.ensure_server(alice)
    k = LabKernel(hub, alice, alice_token)
    try:
        k.ok("%jaxsys start --hosts 2 --devices-per-host 1 --standby 0", timeout=180)
        hub.kill_hub()
        # The proxy the dead hub started still carries the Lab.
        _assert_sum(k.ok(SUM_CELL))
        t0 = time.monotonic()
        hub.start()
        wait_for(lambda: (hub.server(alice) or {}).get("ready"), 60, "the Lab ready again")
        # The new hub replaced the proxy; the kernel is reached again through the new one.
        wait_for(lambda: _reaches(k), 60, "the kernel through the new proxy")
        print(f"hub restarted, Lab reached again in {time.monotonic() - t0:.1f} s")
        _assert_sum(k.ok(SUM_CELL))
        k.ok("%jaxsys stop")
    finally:
        k.close()


def _reaches(k: LabKernel) -> bool:
    try:
        k.ws.close()
        k.connect()
        return k.ok("print(6 * 7)", timeout=30).strip() == "42"
    except Exception:  # noqa: BLE001  (not yet: the proxy's route is being added)
        return False


def test_slurm_launcher_from_the_lab_then_the_hub_stops_the_lab_leaving_nothing(
    hub, alice, alice_token
):
    hub.ensure_server(alice)
    k = LabKernel(hub, alice, alice_token)
    try:
        out, error = k.execute(
            "%jaxsys start --launcher slurm --hosts 2 --devices-per-host 1 --time 10:00",
            timeout=180,
        )
        assert error is None, f"{error}\n{out}\n{hub.slurm.log_tail()}"
        _assert_sum(k.ok(SUM_CELL))
        jobs = hub.job_of(alice)
        assert len(jobs) == 2, jobs
        env = k.ok("%%multihost\nimport os\nprint('cpus', os.environ.get('SLURM_CPUS_PER_TASK'))")
        assert "cpus None" in env, f"the Lab job's variables reached the engines:\n{env}"
    finally:
        k.ws.close()
    hub.stop(alice)
    _nothing_left(hub, alice)


def test_attach_to_the_labs_own_job_then_stop_leaves_the_lab_alive(hub, alice, alice_token):
    hub.ensure_server(alice)
    k = LabKernel(hub, alice, alice_token)
    try:
        job = k.ok("import os\nprint(os.environ['SLURM_JOB_ID'])").strip()
        out, error = k.execute(f"%jaxsys attach {job} --hosts 2 --devices-per-host 1", timeout=180)
        assert error is None, f"{error}\n{out}\n{hub.slurm.log_tail()}"
        _assert_sum(k.ok(SUM_CELL))
        k.ok("%jaxsys stop")
        assert k.ok("print(6 * 7)").strip() == "42"
        assert hub.server(alice)["ready"]
        assert re.search(rf"^{job} \S+ RUNNING$", "\n".join(hub.job_of(alice)), re.M)
        k.ok(f"%jaxsys attach {job} --hosts 2 --devices-per-host 1", timeout=180)
    finally:
        k.ws.close()
    hub.stop(alice)
    _nothing_left(hub, alice)


def test_without_the_shipped_callback_a_users_command_runs_as_the_hub():
    """The hole the shipped callback closes, shown on batchspawner's own handler: the
    command only creates a file in the test's own folder."""
    with LabHub(safe_callback=False) as unsafe:
        alice = unsafe.users[0]
        unsafe.spawn(alice)
        marker = unsafe.dir / "escalated"
        evil = {"batch_query_cmd": f"true; id -u > {marker}; squeue -h -j {{job_id}} -o '%T %B'"}
        r = requests.post(f"{unsafe.url}/hub/api/batchspawner", json=evil, timeout=30,
                          headers={"Authorization": f"token {unsafe.server_token(alice)}"})  # fmt: skip
        assert r.status_code == 200, (r.status_code, r.text)
        wait_for(
            lambda: marker.exists() and marker.read_text().strip(), 30, "the user's command run"
        )
        assert marker.read_text().strip() == str(os.getuid())
