"""Allocations without a scheduler: job states, batch scripts, waiting with a reason, and
the MPI launcher's checks before anything starts."""

from __future__ import annotations

import pytest

from jaxsys_kernel.cluster import Cluster, ClusterStartError
from jaxsys_kernel.cluster.allocation import (
    Allocation,
    AllocationEndedError,
    JobState,
    JobStatus,
    allocation_from_dict,
)
from jaxsys_kernel.cluster.allocation_slurm import SlurmAllocation, SlurmError, batch_script
from jaxsys_kernel.cluster.config import ClusterConfig
from jaxsys_kernel.cluster.launchers import make_launcher


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("PENDING", JobState.PENDING),
        ("PD", JobState.PENDING),
        ("RUNNING", JobState.RUNNING),
        ("CG", JobState.COMPLETING),
        ("CANCELLED by 0", JobState.CANCELLED),
        ("TIMEOUT", JobState.TIMEOUT),
        ("NODE_FAIL", JobState.NODE_FAIL),
        ("REQUEUED", JobState.PENDING),
    ],
)
def test_slurm_states(text, state):
    assert JobState.from_slurm(text) is state


def test_which_states_are_over():
    assert not JobState.PENDING.terminal and not JobState.RUNNING.terminal
    assert JobState.COMPLETING.terminal and JobState.CANCELLED.terminal
    assert JobState.GONE.terminal


def test_a_status_says_state_reason_and_hosts():
    assert JobStatus(JobState.PENDING, "JobHeldUser").describe() == "pending (JobHeldUser)"
    assert JobStatus(JobState.RUNNING, "None", ["h0", "h1"]).describe() == "running on h0,h1"
    assert JobStatus(JobState.CANCELLED, "", ["h0"]).describe() == "cancelled"


def test_the_batch_script_holds_the_job_and_carries_the_options(tmp_path):
    text = batch_script(
        "jaxsys-abc",
        3,
        {"partition": "gpu", "time": "10:00", "account": "", "sbatch_args": ["--exclusive"]},
        tmp_path / "log" / "slurm-%j.out",
    )
    lines = text.splitlines()
    assert lines[0] == "#!/bin/sh"
    assert "#SBATCH --job-name=jaxsys-abc" in lines
    assert "#SBATCH --ntasks=3" in lines
    assert "#SBATCH --partition=gpu" in lines and "#SBATCH --time=10:00" in lines
    assert "#SBATCH --exclusive" in lines
    assert not any("account" in line for line in lines)
    assert f"#SBATCH --output={tmp_path}/log/slurm-%j.out" in lines


class _Scripted(Allocation):
    """An allocation whose polls return a script of states."""

    def __init__(self, *states):
        super().__init__(["h0"])
        self.states = list(states)

    def poll(self):
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def describe_job(self):
        return "job 7"


def test_waiting_reports_each_state_and_reason_once():
    seen = []
    alloc = _Scripted(
        JobStatus(JobState.PENDING, "Priority"),
        JobStatus(JobState.PENDING, "Priority"),
        JobStatus(JobState.PENDING, "Resources"),
        JobStatus(JobState.RUNNING, "None", ["h0"]),
    )
    status = alloc.wait_running(lambda what, k, n: seen.append(what), poll_s=0)
    assert status.state is JobState.RUNNING
    assert seen == ["job 7 pending (Priority)", "job 7 pending (Resources)", "job 7 running on h0"]


def test_a_job_that_ends_while_pending_names_the_reason():
    alloc = _Scripted(JobStatus(JobState.PENDING, "JobHeldUser"), JobStatus(JobState.CANCELLED))
    with pytest.raises(AllocationEndedError, match="job 7 ended before it ran: cancelled"):
        alloc.wait_running(poll_s=0)


def test_a_queue_timeout_says_where_the_job_stands():
    alloc = _Scripted(JobStatus(JobState.PENDING, "Resources"))
    with pytest.raises(TimeoutError, match=r"job 7 is still pending \(Resources\) after 0 s"):
        alloc.wait_running(timeout=0, poll_s=0)


def test_allocations_round_trip_through_a_dict():
    assert allocation_from_dict(Allocation(["a", "b"]).to_dict()).hosts == ["a", "b"]
    job = SlurmAllocation(name="jaxsys-x", ntasks=3, job_id="42")
    again = allocation_from_dict(job.to_dict())
    assert isinstance(again, SlurmAllocation)
    assert (again.job_id, again.name, again.ntasks) == ("42", "jaxsys-x", 3)
    with pytest.raises(ValueError, match="no allocation of kind 'pbs'"):
        allocation_from_dict({"kind": "pbs"})


def test_without_sbatch_submitting_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    alloc = SlurmAllocation(ntasks=2, script_dir=tmp_path)
    with pytest.raises(SlurmError, match="sbatch is not on PATH.*Slurm's client commands"):
        alloc.submit()


def test_slurm_options_are_checked_before_anything_starts():
    cfg = ClusterConfig(hosts=2, launcher="slurm", launcher_options={"partition": "debug"})
    assert cfg.launcher_options == {"partition": "debug"}
    with pytest.raises(ValueError, match="partion is not a setting of the slurm launcher"):
        ClusterConfig(hosts=2, launcher="slurm", launcher_options={"partion": "debug"})


# -- MPI's checks --------------------------------------------------------------------------


def test_mpi_without_mpiexec_fails_at_once_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    cluster = Cluster(hosts=2, launcher="mpi", telemetry=False, secure=False)
    with pytest.raises(ClusterStartError, match="needs mpiexec on PATH.*openmpi-bin"):
        cluster.start_sync()
    assert cluster.state == "stopped"


def test_mpi_without_mpi4py_fails_at_once_naming_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mpi4py" else real(name, *a)
    )
    # mpiexec is looked for first; pretend it is there, so the test needs no MPI installed.
    monkeypatch.setattr("shutil.which", lambda name, *a: f"/usr/bin/{name}")
    launcher = make_launcher(ClusterConfig(hosts=2, launcher="mpi"))
    with pytest.raises(ClusterStartError, match=r"needs mpi4py.*jaxsys\[mpi\]"):
        launcher.check_tools()


def test_mpi_spreads_ranks_with_a_hostfile(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=1\nb slots=1\n")
    mpi = make_launcher(
        ClusterConfig(hosts=2, launcher="mpi", launcher_options={"hostfile": str(hostfile)})
    )
    assert mpi.launch_options()["mpi_args"][:2] == ["--hostfile", str(hostfile)]
    assert "OMPI_MCA_rmaps_base_oversubscribe" in mpi.mpiexec_env() or (
        "OMPI_MCA_rmaps_base_oversubscribe" in __import__("os").environ
    )


def test_open_mpi_keeps_its_files_in_the_profile_but_not_with_a_hostfile(
    tmp_path, monkeypatch
):
    from jaxsys_kernel.cluster.launchers.base import EngineContext
    from jaxsys_kernel.cluster.launchers.mpi import SEGMENT_DIR, SESSION_DIR

    for name in (SESSION_DIR, SEGMENT_DIR):
        monkeypatch.delenv(name, raising=False)
    ctx = EngineContext(incarnation=3, profile=tmp_path)
    here = str(tmp_path / "mpi" / "3")
    local = make_launcher(ClusterConfig(hosts=2, launcher="mpi")).engine_env(0, ctx)
    assert local[SESSION_DIR] == local[SEGMENT_DIR] == here
    # The ranks on the hosts of a hostfile would make this machine's directory there, and
    # Open MPI refuses a place for mpiexec's files alone.
    (tmp_path / "hosts").write_text("a slots=2\n")
    spread = make_launcher(
        ClusterConfig(hosts=2, launcher="mpi", launcher_options={"hostfile": str(tmp_path / "hosts")})
    ).engine_env(0, ctx)
    assert SESSION_DIR not in spread and SEGMENT_DIR not in spread
    # A place the user chose is kept.
    monkeypatch.setenv(SEGMENT_DIR, "/scratch")
    assert SEGMENT_DIR not in make_launcher(ClusterConfig(hosts=2, launcher="mpi")).engine_env(0, ctx)


# -- %jaxsys start's scheduler flags ----------------------------------------------------------


def test_start_passes_the_scheduler_flags_as_launcher_options():
    from IPython.core.magic_arguments import parse_argstring

    from jaxsys_kernel.magics import actions
    from jaxsys_kernel.magics.actions_jobs import launcher_options

    args = parse_argstring(
        actions.start,
        "--launcher slurm --hosts 3 --partition p --time 5:00 --account a "
        "--sbatch-arg=--hold --sbatch-arg=--ntasks-per-node=1",
    )
    assert launcher_options(args) == {
        "launcher_options": {
            "partition": "p",
            "time": "5:00",
            "account": "a",
            "sbatch_args": ["--hold", "--ntasks-per-node=1"],
        }
    }
    assert launcher_options(parse_argstring(actions.start, "--hosts 2")) == {}
    assert "attach" in actions.ACTIONS
