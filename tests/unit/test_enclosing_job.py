"""The kernel's own Slurm job: named in the status with its CPUs, a cluster that does not fit
them said, and a node shared with other users' jobs said with what to ask for."""

from __future__ import annotations

import socket
import subprocess

import pytest

from jaxsys_kernel.cluster import enclosing_job as ej

JOB = {"SLURM_JOB_ID": "12", "SLURM_CPUS_ON_NODE": "2", "SLURMD_NODENAME": socket.gethostname()}


class _Cluster:
    def __init__(self, nprocs=4, devices=2, job_id=None, nodes=None):
        self.nprocs, self.devices_per_host = nprocs, devices
        self._job = {"job_id": job_id, "nodes": nodes or [socket.gethostname()]}

    def job(self):
        return self._job


def test_outside_a_job_nothing_is_said():
    assert ej.enclosing_job({}) is None
    assert ej.status_line(_Cluster(), {}) is None
    assert ej.shared_node_line({}) is None


@pytest.mark.parametrize("bad", ["", "abc", "12; rm -rf", "1" * 40])
def test_a_job_id_that_is_no_job_id_is_ignored(bad):
    assert ej.enclosing_job({**JOB, "SLURM_JOB_ID": bad}) is None


def test_the_status_names_the_job_and_a_cluster_too_big_for_its_cpus():
    line = ej.status_line(_Cluster(4, 2), JOB)
    assert line.startswith(f"kernel: in Slurm job 12 (2 CPUs on {socket.gethostname()})")
    assert "4 processes x 2 devices run on this node and share its 2 CPUs" in line
    assert "%jaxsys start --hosts 2" in line


def test_a_cluster_that_fits_or_runs_in_another_job_is_not_warned_about():
    assert "share" not in ej.status_line(_Cluster(2, 1), JOB)
    assert "share" not in ej.status_line(_Cluster(8, 1, job_id="13", nodes=["n1", "n2"]), JOB)
    # Attached to the kernel's own job, on this node: the same CPUs.
    assert "share" in ej.status_line(_Cluster(4, 1, job_id="12"), JOB)


def _squeue(monkeypatch, stdout, rc=0):
    done = subprocess.CompletedProcess(["squeue"], rc, stdout, "")
    monkeypatch.setattr(ej, "run_slurm", lambda argv: done if stdout is not None else None)
    monkeypatch.setattr(ej.getpass, "getuser", lambda: "alice")


def test_other_users_jobs_on_the_node_are_said_with_what_to_ask_for(monkeypatch):
    _squeue(monkeypatch, "alice\nbob\nbob\ncarol\n")
    line = ej.shared_node_line(JOB)
    assert "(bob, carol)" in line and "data plane" in line and "--exclusive" in line


def test_a_node_of_ones_own_is_not_said_and_no_answer_is(monkeypatch):
    _squeue(monkeypatch, "alice\n")
    assert ej.shared_node_line(JOB) is None
    _squeue(monkeypatch, None)
    assert "did not answer" in ej.shared_node_line(JOB)


def test_many_users_are_named_briefly(monkeypatch):
    _squeue(monkeypatch, "".join(f"{'u' * 100}{i}\n" for i in range(50)))
    assert len(ej.shared_node_line(JOB)) < 400
