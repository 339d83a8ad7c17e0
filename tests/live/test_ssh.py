"""A cluster started through ipyparallel's ssh launcher, on hosts that run a real sshd.

Each host is a network namespace with its own address and its own OpenSSH server; the
kernel side reaches them over the bridge, exactly as it would reach real machines.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from jaxsys_kernel import Cluster
from jaxsys_kernel._ranges import parse_procs

from .. import netns, sshd
from ..harness import run_on

SUM_CELL = """
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((jax.device_count(),), ('x',))
local = np.full((jax.local_device_count(),), jax.process_index() + 1.0, np.float32)
arr = jax.make_array_from_process_local_data(NamedSharding(mesh, P('x')), local)
print('total', float(jax.jit(lambda a: a.sum())(arr)), 'devices', jax.device_count())
"""


def _printed_by_all(out: str, n: int = 2) -> str:
    """The one line every process printed, however collation grouped it.

    Identical lines are merged only if they arrive within a tenth of a second of each
    other, which two busy hosts may miss; this test is about ssh, not about that.
    """
    by_text: dict[str, set[int]] = {}
    for line in out.splitlines():
        m = re.fullmatch(r"\[p([\d,-]+)\] (.*)", line)
        assert m, f"unexpected output line {line!r} in {out!r}"
        by_text.setdefault(m.group(2), set()).update(parse_procs(m.group(1), n))
    assert len(by_text) == 1, f"more than one distinct line: {out!r}"
    (text,) = by_text
    assert by_text[text] == set(range(n)), out
    return text


def _engines_in(hosts: netns.TestHosts, nannies: bool = False) -> list[int]:
    """Live engine processes inside the hosts (and their nannies, if asked)."""
    ours = set()
    for ns in hosts.namespaces:
        ours.update(netns.namespace_pids(ns))
    engines = []
    for pid in ours:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except OSError:
            continue
        is_nanny = b"ipyparallel.engine.nanny" in cmd
        if b"ipyparallel.engine" in cmd and state != "Z" and (nannies or not is_nanny):
            engines.append(pid)
    return engines


@pytest.fixture(scope="module")
def ssh_hosts(tag, tmp_path_factory):
    """Two hosts, each a network namespace running its own sshd."""
    reason = sshd.available()
    if reason:
        pytest.skip(f"no ssh servers in network namespaces here: {reason}")
    with (
        netns.TestHosts(2, prefix="js") as hosts,
        sshd.SSHServers(hosts, tmp_path_factory.mktemp("ssh")) as ssh,
    ):
        yield hosts, ssh


def _cluster(hosts, ssh, progress=None) -> Cluster:
    return Cluster(
        hosts=[ssh.destination(i) for i in range(hosts.n)],
        devices_per_host=2,
        launcher="ssh",
        controller_ip=hosts.bridge_address,
        env={"JAX_PLATFORMS": "cpu"},
        launcher_options={"ssh_args": ssh.ssh_args, "scp_args": ssh.ssh_args},
        progress=progress or (lambda e: None),
    )


def _wait_engines_gone(hosts, timeout: float) -> float:
    t0 = time.monotonic()
    while _engines_in(hosts, nannies=True) and time.monotonic() - t0 < timeout:
        time.sleep(0.1)
    assert _engines_in(hosts, nannies=True) == [], "engines survived on their hosts"
    return time.monotonic() - t0


def test_cluster_over_ssh(ssh_hosts):
    hosts, ssh = ssh_hosts
    events = []
    c = _cluster(hosts, ssh, progress=events.append)
    try:
        c.start_sync()
        # Launching over ssh takes seconds: it shows progress, as registering does.
        stages = [(e.stage, e.done) for e in events]
        assert ("engines launched over ssh", 2) in stages
        assert stages.index(("engines launched over ssh", 2)) < stages.index(
            ("engines registered", 2)
        )
        # Process 0 serves the coordination service on its own host's address.
        assert c.coordinator_address.startswith(hosts.host_addresses[0] + ":")
        assert [p["state"] for p in c.status()] == ["ready", "ready"]
        assert _printed_by_all(run_on(c, SUM_CELL)) == "total 6.0 devices 4"
        # Process i runs on host i: the one its ssh destination named.
        assert [p["address"] for p in c.status()] == hosts.host_addresses
        assert len(_engines_in(hosts)) == 2
        # Faults on real hosts: kill one process, bring it back into the running world,
        # then restart the whole world, which must replace (not add to) the engines.
        c.kill_process(1)
        assert [p["state"] for p in c.status()] == ["ready", "dead"]
        c.restart_process_sync(1)
        assert [p["state"] for p in c.status()] == ["ready", "ready"]
        assert _printed_by_all(run_on(c, "import jax; print(jax.process_count())")) == "2"
        c.restart_sync()
        assert _printed_by_all(run_on(c, SUM_CELL)) == "total 6.0 devices 4"
        assert len(_engines_in(hosts)) == 2
    finally:
        took = c.kill()
    # Stopping reaches the engines on their hosts, over ssh.
    _wait_engines_gone(hosts, timeout=10)
    assert took < 10


FAIL_BEFORE_COLLECTIVE = """
import jax, numpy as np
from jax.experimental import multihost_utils
if jax.process_index() == 1:
    raise ValueError('p1 fails before the collective')
multihost_utils.process_allgather(np.ones(3))
"""


def test_hang_doctor_reads_stacks_from_other_hosts(ssh_hosts, capsys):
    # The stacks of a process stuck on another host come back over telemetry, and the
    # interrupt reaches it through its nanny.
    from jaxsys_kernel.magics.session import MultihostSession

    hosts, ssh = ssh_hosts
    session = MultihostSession()
    session.cluster = c = _cluster(hosts, ssh)
    try:
        c.start_sync()
        capsys.readouterr()
        with pytest.raises(Exception) as err:
            session.run_cell(FAIL_BEFORE_COLLECTIVE, grace=2)
        report = capsys.readouterr().err
    finally:
        c.kill()
    assert type(err.value).__name__ == "MultihostHang"
    assert "jaxsys hang doctor: p1 failed and p0 kept running for 2 s more" in report
    assert "p0: still running" in report
    assert "** " in report and "multihost_utils.py" in report  # inside the collective
    assert ">> " in report  # and the user's line that called it
    assert "jaxsys: interrupting p0" in report


def test_engines_over_ssh_leave_when_the_kernel_dies(ssh_hosts):
    # A dying kernel takes its controller along (death signal: SIGTERM, which lets the
    # controller stop its schedulers); nothing can signal the remote engines, so they
    # must notice the silence themselves.
    hosts, ssh = ssh_hosts
    c = _cluster(hosts, ssh)
    try:
        c.start_sync()
        assert len(_engines_in(hosts)) == 2
        os.kill(c._ipp.controller.pid, signal.SIGTERM)
        took = _wait_engines_gone(hosts, timeout=40)
    finally:
        c.kill()
    assert took < 30
