"""A Slurm job kept past a cluster and its kernel: ``%jaxsys stop --keep-allocation`` saves
it with the cluster's options, and ``%jaxsys attach`` with no job id starts the engines in
it again, or says plainly why it cannot."""

from __future__ import annotations

import json
import stat
import time
import types

import pytest
from IPython.core.error import UsageError

from jaxsys_kernel.cluster import lease as leases
from jaxsys_kernel.cluster.allocation import (
    JobState,
    JobStatus,
    load_saved,
    save_allocation,
    saved_file,
    saved_names,
)
from jaxsys_kernel.cluster.allocation_slurm import SlurmAllocation, lease_file
from jaxsys_kernel.cluster.config import ClusterConfig
from jaxsys_kernel.cluster.launchers import make_launcher
from jaxsys_kernel.errors import ConfigError
from jaxsys_kernel.magics import actions, actions_jobs

from ..fakes import StartSession


@pytest.fixture(autouse=True)
def state(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXSYS_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _job_is(monkeypatch, state: JobState, hosts=("n0", "n1", "n2")):
    monkeypatch.setattr(SlurmAllocation, "poll", lambda self: JobStatus(state, hosts=list(hosts)))


def test_a_saved_allocation_comes_back_with_its_options(state):
    path = save_allocation(SlurmAllocation(name="jaxsys-x", ntasks=3, job_id="12"), {"hosts": 3})
    assert path == state / "kernel-allocation.json" == saved_file()
    alloc, options = load_saved()
    assert isinstance(alloc, SlurmAllocation)
    assert (alloc.job_id, alloc.ntasks, options) == ("12", 3, {"hosts": 3})
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="kernel-allocation.json does not describe"):
        load_saved()


def test_attach_without_a_job_id_reuses_the_kept_job_and_its_options(monkeypatch):
    _job_is(monkeypatch, JobState.RUNNING)
    options = {"hosts": 3, "devices_per_host": 1, "env": {"A": "1"}, "launcher": "slurm"}
    save_allocation(SlurmAllocation(ntasks=3, job_id="12"), options)
    session = StartSession(cluster=None)
    actions.dispatch(session, "attach --devices-per-host 2")
    assert session.kwargs["launcher_options"] == {"job_id": "12"}
    assert (session.kwargs["hosts"], session.kwargs["devices_per_host"]) == (3, 2)
    assert session.kwargs["env"] == {"A": "1"}
    # Kept again, for the next kernel.
    assert load_saved()[0].job_id == "12"


def test_attach_says_what_to_do_without_a_kept_job_or_when_it_ended(monkeypatch):
    session = StartSession(cluster=None)
    with pytest.raises(UsageError, match=r"no saved job to attach to .*--keep-allocation"):
        actions.dispatch(session, "attach")
    _job_is(monkeypatch, JobState.CANCELLED)
    save_allocation(SlurmAllocation(ntasks=3, job_id="12"), {"hosts": 3})
    with pytest.raises(UsageError, match=r"saved Slurm job 12 is cancelled.*%jaxsys start"):
        actions.dispatch(session, "attach")
    assert load_saved() is None  # an ended job is forgotten
    assert session.kwargs is None


def _cluster(launcher_name: str, **options):
    config = ClusterConfig(hosts=3, launcher=launcher_name, **options)
    launcher = make_launcher(config)
    return types.SimpleNamespace(config=config, world=types.SimpleNamespace(launcher=launcher))


def test_stop_keep_allocation_keeps_the_job_past_the_teardown(monkeypatch, capsys):
    cluster = _cluster("slurm")
    launcher = cluster.world.launcher
    launcher.allocation = SlurmAllocation(name="jaxsys-x", ntasks=3, job_id="12")
    cancelled = []
    monkeypatch.setattr(SlurmAllocation, "cancel", lambda self: cancelled.append(self.job_id))

    class Session(StartSession):
        def stop(self):
            launcher.release()  # what the teardown does
            return 0.5

    actions.dispatch(Session(cluster), "stop --keep-allocation")
    out = capsys.readouterr().out
    assert "cluster stopped in 0.50 s" in out
    assert "Slurm job 12 is kept" in out and "scancel 12" in out
    assert cancelled == []
    alloc, options = load_saved()
    assert alloc.job_id == "12" and options["hosts"] == 3 and options["launcher"] == "slurm"


def test_stop_keep_allocation_refuses_a_launcher_without_one(capsys):
    # An mpiexec job ends with its engines: nothing to keep (local and ssh keep hosts).
    session = StartSession(_cluster("mpi"))
    with pytest.raises(UsageError, match="the mpi launcher holds nothing that outlives"):
        actions.dispatch(session, "stop --keep-allocation")
    assert load_saved() is None


def test_kept_allocations_coexist_under_names_privately(state):
    save_allocation(SlurmAllocation(ntasks=3, job_id="12"), {"env": {"TOKEN": "s3cret"}})
    save_allocation(SlurmAllocation(ntasks=2, job_id="13"), {"hosts": 2}, "big-run")
    assert load_saved()[0].job_id == "12"
    assert load_saved("big-run")[0].job_id == "13"
    assert saved_names() == [None, "big-run"]
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for path in state.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert sorted(p.name for p in state.iterdir()) == [
        "kernel-allocation-big-run.json",
        "kernel-allocation.json",
    ]  # written whole: no temporary file left


@pytest.mark.parametrize("name", ["../x", "a/b", "..", "x..y", "", ".hidden", "a" * 65])
def test_a_name_that_could_leave_the_state_directory_is_refused(name, monkeypatch):
    with pytest.raises(ConfigError, match="cannot name a kept allocation"):
        save_allocation(SlurmAllocation(ntasks=3, job_id="12"), {}, name)
    _job_is(monkeypatch, JobState.RUNNING)
    with pytest.raises(UsageError, match="cannot name a kept allocation"):
        actions.dispatch(StartSession(cluster=None), f"attach --name={name}")


def test_a_job_is_marked_kept_only_once_it_is_saved(monkeypatch, state):
    cluster = _cluster("slurm")
    launcher = cluster.world.launcher
    launcher.allocation = SlurmAllocation(name="jaxsys-x", ntasks=3, job_id="12")
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text("a file where the state directory should be")
    with pytest.raises(UsageError, match="Slurm job 12 cannot be kept: saving it in .* failed"):
        actions_jobs.keep_allocation(StartSession(cluster))
    assert not launcher._kept  # release() still cancels it: nothing would find it again


def test_attach_is_refused_while_another_live_kernel_holds_the_job(monkeypatch, state):
    _job_is(monkeypatch, JobState.RUNNING)
    holder = leases.LeaseState(time.time() + 30, 4321, None, "nodeA", 30.0, leases.KEPT)
    leases.write_private(
        lease_file("12"), f"{int(holder.expires)}\n{json.dumps(holder.__dict__)}\n"
    )
    session = StartSession(cluster=None)
    with pytest.raises(UsageError, match=r"Slurm job 12 is in use by process 4321 on nodeA"):
        actions.dispatch(session, "attach 12")
    assert session.kwargs is None
