"""What the Slurm and MPI launchers ask of their tools, with the tools replaced: a world
restart under Slurm signals the engines' steps (those jaxsys named) and never the job or
another step; Open MPI is told to
export every engine variable to ranks on other hosts; Slurm's step-cancelled line is no
output of a notebook's job."""

from __future__ import annotations

import subprocess

from jaxsys_kernel.cluster import allocation_slurm, slurm_watch
from jaxsys_kernel.cluster.config import ClusterConfig
from jaxsys_kernel.cluster.launchers import make_launcher, mpi
from jaxsys_kernel.job import collate_outputs
from jaxsys_kernel.job.program import CELL_MARK, Cell, Program


def _slurm(monkeypatch, steps: str) -> list[list[str]]:
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, steps if argv[0] == "squeue" else "", "")

    monkeypatch.setattr(slurm_watch.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(slurm_watch.subprocess, "run", run)
    return calls


def test_killing_the_steps_names_each_of_jaxsys_steps_and_never_the_job(monkeypatch):
    name = allocation_slurm.STEP_NAME
    calls = _slurm(
        monkeypatch,
        f"12.0 {name}\n12.batch batch\n12.1 {name}\n12.2 jupyterhub-singleuser\n"
        "12.3 sleep\n12.extern extern\n",
    )
    allocation_slurm.kill_steps("12")
    # SIGKILL sent to job 12 itself would cancel it; 12.2 and 12.3 are the owner's.
    assert calls[-1] == ["scancel", "-s", "KILL", "12.0", "12.1"]


def test_no_step_of_jaxsys_means_no_scancel(monkeypatch):
    calls = _slurm(monkeypatch, "12.batch batch\n12.0 bash\n")
    allocation_slurm.kill_steps("12")
    assert [c[0] for c in calls] == ["squeue"]


def test_the_engines_step_is_named_and_says_its_environment(monkeypatch):
    from jaxsys_kernel.cluster.allocation_slurm import SlurmAllocation

    monkeypatch.setenv("SLURM_EXPORT_ENV", "NONE")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    monkeypatch.setenv("SRUN_CPUS_PER_TASK", "4")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    argv = SlurmAllocation(job_id="12").step_command(3)
    srun = argv.index("srun")
    assert f"--job-name={allocation_slurm.STEP_NAME}" in argv[srun:]
    assert "--export=ALL" in argv[srun:]
    # The job the kernel runs in: its variables are left out, where the cluster is stays.
    assert argv[0] == "env" and set(argv[1:srun:2]) == {"-u"}
    unset = set(argv[2:srun:2])
    assert {"SLURM_EXPORT_ENV", "SLURM_CPUS_PER_TASK", "SRUN_CPUS_PER_TASK"} <= unset
    assert "SLURM_CONF" not in unset


def test_slurms_commands_run_without_the_outer_jobs_variables():
    environ = {
        "PATH": "/bin",
        "SLURM_CONF": "/c",
        "SLURM_EXPORT_ENV": "NONE",
        "SLURM_MEM_PER_CPU": "100",
        "SBATCH_EXPORT": "NONE",
        "SQUEUE_FORMAT": "%i",
    }
    assert slurm_watch.client_env(environ) == {"PATH": "/bin", "SLURM_CONF": "/c"}


def test_open_mpi_is_told_to_export_every_engine_variable(monkeypatch):
    launcher = make_launcher(ClusterConfig(hosts=2, launcher="mpi"))
    monkeypatch.delenv(mpi.OMPI_EXPORTS, raising=False)
    (value,) = launcher.exports({"JAXSYS_COORDINATOR": "h:1", "XLA_FLAGS": "-x"}).values()
    assert value.split(";") == [
        "IPP_CLUSTER_ID",
        "IPP_PROFILE_DIR",
        "JAXSYS_COORDINATOR",
        "XLA_FLAGS",
    ]
    # A list of the user's own stays first.
    (value,) = launcher.exports({mpi.OMPI_EXPORTS: "MINE", "XLA_FLAGS": "-x"}).values()
    assert value.split(";")[0] == "MINE" and "XLA_FLAGS" in value.split(";")


def test_slurms_step_cancelled_line_is_left_out_of_a_jobs_log():
    prog = Program(cells=[Cell(1, "")], hosts=2)
    outputs = {
        0: f"{CELL_MARK}1\nslurmstepd-host0: error: *** STEP 4.0 ON host0 CANCELLED AT "
        "2026-12-02T03:41:35 ***\n",
        1: f"{CELL_MARK}1\nValueError: p1 fails\n",
    }
    assert collate_outputs(prog, outputs).log == "--- cell 1 ---\n[p1] ValueError: p1 fails\n"


def test_gloo_chatter_broken_over_two_lines_is_left_out_of_a_jobs_log():
    prog = Program(cells=[Cell(1, "")], hosts=2)
    tail = "peer ranks. Expected number of connected peer ranks is : 7"
    outputs = {
        0: f"{CELL_MARK}1\n1 is connected to \n7 {tail}\nsum: 48.0\n10\n",
        1: f"{CELL_MARK}1\n[Gloo] Rank 3 is connected to 7 {tail}\nsum: 48.0\n20\n",
    }
    assert collate_outputs(prog, outputs).log == (
        "--- cell 1 ---\n[p0-1] sum: 48.0\n[p0] 10\n[p1] 20\n"
    )


def test_gloo_chatter_broken_before_expected_is_left_out_but_words_like_it_stay():
    prog = Program(cells=[Cell(1, "")], hosts=2)
    outputs = {
        # As a slow connection on a busy host printed it under Slurm.
        0: f"{CELL_MARK}1\n[Gloo] Rank 2 is connected to \n 7 peer ranks. \n"
        "Expected number of connected peer ranks is : 7\nsum: 48.0\n",
        1: f"{CELL_MARK}1\nsum: 48.0\nwe have 7 peer ranks. \n",
    }
    assert collate_outputs(prog, outputs).log == (
        "--- cell 1 ---\n[p0-1] sum: 48.0\n[p1] we have 7 peer ranks. \n"
    )


def test_gloo_notices_whose_ends_crossed_leave_nothing_behind():
    # Process 2's devices (gloo ranks 4 and 5) under Slurm: the first notice's end went to
    # the second line, after the second notice had been written whole into the first.
    prog = Program(cells=[Cell(1, "")], hosts=2)
    expected = "Expected number of connected peer ranks is : 7"
    outputs = {
        0: f"{CELL_MARK}1\nsum: 48.0\n",
        1: f"{CELL_MARK}1\n[Gloo] Rank 4 is connected to 7 peer ranks. [Gloo] Rank 5 is "
        f"connected to 7 peer ranks. {expected}\n{expected}\nsum: 48.0\n",
    }
    assert collate_outputs(prog, outputs).log == "--- cell 1 ---\n[p0-1] sum: 48.0\n"


def test_gloo_notices_written_into_each_other_leave_no_number_behind():
    # Process 1's two devices (gloo ranks 2 and 3) wrote their notices into each other, as
    # they did under Slurm; the rank glued before the second notice is gloo's, not output.
    prog = Program(cells=[Cell(1, "")], hosts=2)
    tail = "peer ranks. Expected number of connected peer ranks is : 7"
    outputs = {
        0: f"{CELL_MARK}1\nsum: 48.0\n2\n",
        1: f"{CELL_MARK}1\n[Gloo] Rank 2[Gloo] Rank 3 is connected to 7 {tail}\n"
        f" is connected to 7 {tail}\nsum: 48.0\n2\n",
    }
    # The cell's own "2", printed by both processes after the notices, is kept.
    assert collate_outputs(prog, outputs).log == "--- cell 1 ---\n[p0-1] sum: 48.0\n[p0-1] 2\n"
