"""A cluster started through ipyparallel's ssh launcher, on hosts that run a real sshd.

Each host is a network namespace with its own address and its own OpenSSH server; the
kernel side reaches them over the bridge, exactly as it would reach real machines.
"""

from __future__ import annotations

import sys
import time

import pytest

from jaxsys_kernel import Cluster
from jaxsys_kernel.magics import executor

from . import netns, sshd

SUM_CELL = """
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((jax.device_count(),), ('x',))
local = np.full((jax.local_device_count(),), jax.process_index() + 1.0, np.float32)
arr = jax.make_array_from_process_local_data(NamedSharding(mesh, P('x')), local)
print('total', float(jax.jit(lambda a: a.sum())(arr)), 'devices', jax.device_count())
"""


class Capture(executor.Sink):
    def __init__(self):
        self.out = ""

    def stdout(self, text):
        self.out += text

    stderr = stdout


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


def test_cluster_over_ssh(tag, tmp_path):
    reason = sshd.available()
    if reason:
        pytest.skip(f"no ssh servers in network namespaces here: {reason}")
    with netns.TestHosts(2, prefix="js") as hosts, sshd.SSHServers(hosts, tmp_path) as ssh:
        c = Cluster(
            hosts=[ssh.destination(i) for i in range(2)],
            devices_per_host=2,
            launcher="ssh",
            controller_ip=hosts.bridge_address,
            env={"JAX_PLATFORMS": "cpu"},
            launcher_options={
                "ssh_args": ssh.ssh_args,
                "scp_args": ssh.ssh_args,
                "remote_python": sys.executable,
            },
            progress=lambda e: None,
        )
        try:
            c.start_sync()
            # Process 0 serves the coordination service on its own host's address.
            assert c.coordinator_address.startswith(hosts.host_addresses[0] + ":")
            assert [p["state"] for p in c.status()] == ["ready", "ready"]
            sink = Capture()
            executor.raise_for_run(executor.execute(c, SUM_CELL, sink=sink))
            assert sink.out == "[p0-1] total 6.0 devices 4\n"
            # Process i runs on host i: the one its ssh destination named.
            assert [p["address"] for p in c.status()] == hosts.host_addresses
            assert len(_engines_in(hosts)) == 2
        finally:
            took = c.kill()
        # Stopping reaches the engines on their hosts, over ssh.
        deadline = time.monotonic() + 10
        while _engines_in(hosts, nannies=True) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _engines_in(hosts, nannies=True) == [], "engines survived on their hosts"
        assert took < 10
