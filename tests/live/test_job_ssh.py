"""`jaxsys job --launcher ssh --submit`: the quickstart as one job of four processes on two
namespace hosts, each started over ssh and joined with mTLS, its output collated as the local
job's is; a failing cell stops the processes on every host and names itself."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jaxsys_kernel.job import ssh as job_ssh

from .. import netns, sshd

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ssh_hosts(tag, tmp_path_factory):
    """Two hosts, each a network namespace running its own sshd."""
    reason = sshd.available()
    if reason:
        pytest.skip(f"no ssh servers in network namespaces here: {reason}")
    with (
        netns.TestHosts(2, prefix="jj") as hosts,
        sshd.SSHServers(hosts, tmp_path_factory.mktemp("ssh")) as ssh,
    ):
        yield hosts, ssh


def _job(ssh, hosts, notebook: str, out: Path, per_host: int, devices: int, extra=()):
    # Process i on host i % 2: a host may run several of the job's processes.
    destinations = ",".join(ssh.destination(i % hosts.n) for i in range(hosts.n * per_host))
    ssh_args = [f"--ssh-arg={a}" for a in ssh.ssh_args]
    return subprocess.run(
        [sys.executable, "-m", "jaxsys_kernel.cli", "job", notebook, "--launcher", "ssh",
         "--hosts", destinations, "--devices-per-host", str(devices), *ssh_args, "--out", str(out),
         "--submit", *extra],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


def test_the_quickstart_runs_over_ssh(ssh_hosts, tmp_path):
    hosts, ssh = ssh_hosts
    # The quickstart's own shape: 4 processes of 2 devices.
    r = _job(ssh, hosts, "notebooks/00-quickstart.ipynb", tmp_path, per_host=2, devices=2)
    assert r.returncode == 0, r.stderr + r.stdout
    log = (tmp_path / "job.log").read_text()
    for expected in (
        "--- cell 8 ---\n[p0] I am process 0 of 4\n",
        "[p0-3] local devices: 2, devices in the world: 8\n",
        "[p0-3] sum: 48.0 mean: 1.5\n",
        "--- cell 24 (failed on p1,3, as expected) ---\n",
        "[p0] 0\n[p1] 10\n[p2] 20\n[p3] 30\n",
    ):
        assert expected in log, log
    for rank in range(4):
        said = (tmp_path / f"p{rank}.out").read_text()
        assert f"jax_mtls_cert_file={tmp_path}/pki/process-{rank}.pem" in said, said
        assert "jax_distributed_verify_secure_credentials=True" in said, said
    # Nothing of the job is left on the hosts.
    assert not [p for ns in hosts.namespaces for p in netns.namespace_pids(ns) if _is_job(p)]


def _is_job(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"program.py" in f.read()
    except OSError:
        return False


def test_a_failing_cell_stops_the_processes_on_every_host(ssh_hosts, tmp_path):
    hosts, ssh = ssh_hosts
    nb = tmp_path / "fails.ipynb"
    import nbformat

    cells = [
        "%jaxsys start --hosts 2 --devices-per-host 4",
        "%%multihost\nimport jax\nif jax.process_index() == 1:\n    raise ValueError('no data')\n"
        "from jax.experimental import multihost_utils\nmultihost_utils.sync_global_devices('x')",
    ]
    nbformat.write(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), nb
    )
    # A folder a regular expression reads otherwise: the processes are still found to kill.
    out = tmp_path / "job (1)"
    r = _job(ssh, hosts, str(nb), out, per_host=1, devices=4)
    assert r.returncode != 0
    assert "cell 1 failed on p1" in r.stderr, r.stderr
    assert (out / "job.log").read_text().endswith("jaxsys job: ended: cell 1 failed on p1\n")
    assert not [p for ns in hosts.namespaces for p in netns.namespace_pids(ns) if _is_job(p)]


def test_the_ssh_runner_kills_a_job_whose_path_a_regular_expression_misreads(tmp_path):
    # The kill command runs here as it would on a host: a process whose program's path has
    # "(1)" in it (as a copied folder's does) is found by the job's marker.
    folder = tmp_path / "job (1)"
    folder.mkdir()
    program = folder / "program.py"
    program.write_text("import time\ntime.sleep(60)\n")
    marker = job_ssh.new_marker()
    command = job_ssh.remote_command(str(program), 0, 1, "h:1", marker)
    assert f"{shlex.quote(str(program))} {marker}" in command
    proc = subprocess.Popen([sys.executable, str(program), marker])
    try:
        killed = subprocess.run(["sh", "-c", job_ssh.kill_command(marker)], timeout=10)
        assert killed.returncode == 0
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
    assert subprocess.run(["sh", "-c", job_ssh.kill_command(marker)], timeout=10).returncode == 1


def test_the_timeout_ends_the_processes_on_every_host(ssh_hosts, tmp_path):
    hosts, ssh = ssh_hosts
    nb = tmp_path / "sleeps.ipynb"
    import nbformat

    cells = ["%jaxsys start --hosts 2", "%%multihost\nimport time\ntime.sleep(600)"]
    nbformat.write(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), nb
    )
    out = tmp_path / "out"
    r = _job(ssh, hosts, str(nb), out, per_host=1, devices=1, extra=["--timeout", "15"])
    assert r.returncode == 124, r.stderr
    assert "Traceback" not in r.stderr
    assert (out / "job.log").read_text().endswith("jaxsys job: ended: timeout after 15 s\n")
    assert not [p for ns in hosts.namespaces for p in netns.namespace_pids(ns) if _is_job(p)]
