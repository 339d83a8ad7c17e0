"""An ssh cluster's hosts kept past its teardown, on real sshd hosts (network namespaces):
the kept grant names the hosts, its engines leave their hosts all the same, a new Cluster
object takes the hosts and runs a collective on them, and its teardown gives them back."""

from __future__ import annotations

import json
import time

from jaxsys_kernel.cluster.allocation import load_saved, save_allocation
from jaxsys_kernel.cluster.allocation_hosts import KeptHosts, lease_file

from ..harness import run_on
from .test_ssh import (
    SUM_CELL,
    _cluster,
    _engines_in,
    _printed_by_all,
    _wait_engines_gone,
    ssh_hosts,  # noqa: F401 - the fixture
)


def _mode(key: str) -> str:
    return json.loads(lease_file(key).read_text().splitlines()[1])["mode"]


def test_kept_ssh_hosts_are_taken_by_a_new_cluster(ssh_hosts, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setenv("JAXSYS_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("JAXSYS_LEASE_TTL", "6")
    hosts, ssh = ssh_hosts
    first = _cluster(hosts, ssh)
    try:
        first.start_sync()
        launcher = first.world.launcher
        alloc = launcher.allocation
        key = alloc.name_key()
        assert key.startswith("ssh-") and not alloc.this_machine
        # What %jaxsys stop --keep-allocation does: save, then keep.
        save_allocation(alloc, {"launcher": "ssh", "hosts": alloc.hosts})
        assert launcher.keep_allocation() is alloc
    finally:
        first.kill()
    # Kept, not running: the engines left their hosts; the lease stays, kept.
    _wait_engines_gone(hosts, timeout=10)
    assert _mode(key) == "kept"
    saved, options = load_saved()
    assert isinstance(saved, KeptHosts) and saved.job_id == key
    assert saved.hosts == [h.split("@")[-1] for h in options["hosts"]] == hosts.host_addresses
    second = _cluster(hosts, ssh)
    try:
        t0 = time.monotonic()
        saved.attach()
        second.start_sync()
        second.world.launcher.hold(saved)
        print(f"a new cluster on kept ssh hosts (2 x 2): {time.monotonic() - t0:.2f} s")
        assert _mode(key) == "run"
        assert _printed_by_all(run_on(second, SUM_CELL)) == "total 6.0 devices 4"
        assert len(_engines_in(hosts)) == 2
    finally:
        second.kill()
    _wait_engines_gone(hosts, timeout=10)
    # Its teardown gave the hosts back: no lease, nothing saved.
    assert not lease_file(key).exists() and load_saved() is None
