"""Every launcher starts its engines on an allocation: this machine (local), the named
hosts (ssh), the hosts of an mpiexec job's hostfile (mpi), a Slurm job (slurm, once
submitted); ``%jaxsys status`` names it for each."""

from __future__ import annotations

import socket
import types

import pytest

from jaxsys_kernel.cluster.allocation import (
    Allocation,
    MpiAllocation,
    allocation_from_dict,
    hostfile_hosts,
)
from jaxsys_kernel.cluster.config import ClusterConfig
from jaxsys_kernel.cluster.launchers import launcher_names, make_launcher
from jaxsys_kernel.errors import ConfigError
from jaxsys_kernel.magics.actions_jobs import job_line


def _line(**options) -> str | None:
    launcher = make_launcher(ClusterConfig(**options))
    return job_line(types.SimpleNamespace(job=launcher.job))


def test_a_local_cluster_runs_on_this_machine():
    here = socket.gethostname()
    assert _line(hosts=2) == f"allocation: this machine, running on {here}"


def test_an_ssh_cluster_runs_on_the_hosts_it_names():
    line = _line(hosts=["me@node1:2222", "node2"], launcher="ssh")
    assert line == "allocation: the named hosts, running on node1,node2"


def test_an_mpi_cluster_runs_on_its_hostfiles_hosts(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=1\n# a comment\n\nnode2 slots=2  # two ranks\nnode1\n")
    assert hostfile_hosts(hostfile) == ["node1", "node2"]
    opts = {"launcher": "mpi", "hosts": 3}
    line = _line(**opts, launcher_options={"hostfile": str(hostfile)})
    assert line == "allocation: the mpiexec job, running on node1,node2"
    assert _line(**opts) == f"allocation: the mpiexec job, running on {socket.gethostname()}"
    # A missing hostfile is the launcher's check to name (before anything starts), not a
    # failure of making the launcher.
    missing = str(tmp_path / "nope")
    assert _line(**opts, launcher_options={"hostfile": missing}).startswith("allocation: ")
    with pytest.raises(ConfigError, match="cannot read the hostfile"):
        hostfile_hosts(missing)


def test_a_slurm_cluster_has_no_allocation_before_its_job_is_submitted():
    assert _line(hosts=2, launcher="slurm") is None


@pytest.mark.parametrize("name", [n for n in launcher_names() if n not in ("slurm", "kubernetes")])
def test_every_launcher_without_a_scheduler_holds_its_hosts_from_the_start(name):
    hosts = ["node1", "node2"] if name == "ssh" else 2
    launcher = make_launcher(ClusterConfig(hosts=hosts, launcher=name))
    assert isinstance(launcher.allocation, Allocation)
    job = launcher.job()
    assert job["job_id"] is None and job["state"].startswith("running on ")
    launcher.allocation.cancel()  # nothing to give back: still there
    assert launcher.allocation.poll().state.value == "running"


def test_allocations_without_a_scheduler_are_saved_and_found_again():
    for alloc in (Allocation(["n1"], label="the named hosts"), MpiAllocation(hosts=["a", "b"])):
        again = allocation_from_dict(alloc.to_dict())
        assert type(again) is type(alloc)
        assert (again.hosts, again.describe_job()) == (alloc.hosts, alloc.describe_job())
