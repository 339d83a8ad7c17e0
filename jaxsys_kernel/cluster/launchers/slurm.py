"""The Slurm launcher: every rank in one Slurm job; ranks come from Slurm's environment.

The job is an allocation (:mod:`~jaxsys_kernel.cluster.allocation_slurm`) that holds the
hosts; engines run in it as one job step per world, so a world restart kills the step and
starts another without queueing again, and stopping the cluster cancels the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ..allocation import AllocationEndedError
from ..allocation_slurm import SlurmAllocation, batch_script, kill_steps, lease_file
from ..lease import refusal
from ..options import Flag
from ..records import ClusterStartError
from .base import EngineContext, Launcher

# Seconds between looks at the job while the cluster runs (each is one squeue call).
JOB_POLL_S = 2.0


class SlurmLauncher(Launcher):
    """Every rank in one Slurm job; ranks come from Slurm's environment (``SLURM_PROCID``).

    ``launcher_options`` take the keys of :attr:`options`.
    """

    name = "slurm"
    options = {
        "partition": "the partition (sbatch --partition)",
        "time": "the time limit (sbatch --time)",
        "account": "the account charged (sbatch --account)",
        "qos": "the quality of service (sbatch --qos)",
        "sbatch_args": "more sbatch options, e.g. ['--ntasks-per-node=1']",
        "srun_args": "more srun options for the engines' job step",
        "job_id": "a running job to use instead of submitting one",
        "queue_timeout": "seconds a job may wait in the queue (default: as long as it takes)",
    }
    flags = (
        Flag("--partition", "Slurm: the partition to queue in", {"metavar": "NAME"}, "partition"),
        Flag("--time", "Slurm: the job's time limit, e.g. 30:00", {"metavar": "T"}, "time"),
        Flag("--account", "Slurm: the account charged", {"metavar": "A"}, "account"),
        Flag(
            "--sbatch-arg",
            "Slurm: one more sbatch option, e.g. --sbatch-arg=--ntasks-per-node=1",
            {"action": "append", "metavar": "ARG"},
            "sbatch_args",
        ),
    )
    rank_variables = ("SLURM_PROCID",)
    size_variables = ("SLURM_NTASKS",)
    allocation_kind = SlurmAllocation

    def __init__(self, config):
        super().__init__(config)
        self.allocation: SlurmAllocation | None = None
        self._last_poll = 0.0
        # The job outlives the cluster (keep_allocation): release leaves it running.
        self._kept = False

    @classmethod
    def job_allocation(cls, job_id: str, ntasks: int = 1, options=None) -> SlurmAllocation:
        if not job_id.isdigit():
            raise ConfigError(f"JOB must be a Slurm job id (digits), not {job_id!r}")
        return SlurmAllocation(job_id=job_id, ntasks=ntasks)

    @classmethod
    def attach_refusal(cls, job_id: str) -> str | None:
        return refusal(lease_file(job_id), f"Slurm job {job_id}")

    @classmethod
    def attached_stop_note(cls, job_id: str) -> str | None:
        try:
            job = cls.job_allocation(job_id).describe_job()
        except ConfigError:
            return None
        return (
            f"jaxsys: {job} keeps running (the cluster was attached to it): "
            f"%jaxsys attach reuses it; scancel {job_id} gives it back"
        )

    def make_allocation(self) -> None:
        # The job is submitted when the engines launch (_acquire), not before.
        return None

    @classmethod
    def batch_job(cls, program, nprocs, out_dir, options):
        # srun stops every task when one exits non-zero; JAX finds its coordinator (the
        # first node) from Slurm's environment.
        script = batch_script(
            f"jaxsys-job-{Path(program).parent.name}", nprocs, options, out_dir / "slurm-%j.out"
        ).split("# Holds the allocation")[0]
        script += (
            f"srun --kill-on-bad-exit=1 --output={out_dir}/p%t.out "
            f"{shlex.quote(sys.executable)} {shlex.quote(str(program))}\n"
        )
        # --export=ALL: the job gets the environment it is submitted from, whatever
        # SLURM_EXPORT_ENV a surrounding job (a Lab's) left there.
        return {"job.sbatch": script}, ["sbatch", "--export=ALL", "--wait", "--quiet", "job.sbatch"]

    def _controller_kwargs(self) -> dict[str, Any]:
        # Deferred: srun.py imports ipyparallel's launchers, which only a starting Slurm
        # cluster needs.
        from .srun import SrunEngineSetLauncher

        return {
            "controller_ip": self.config.controller_ip or "*",
            "engine_launcher_class": SrunEngineSetLauncher,
        }

    async def acquire(self, ctx: EngineContext, report: Callable[[str, int, int], None]) -> None:
        await asyncio.to_thread(self._acquire, ctx, report)

    def _acquire(self, ctx: EngineContext, report: Callable[[str, int, int], None]):
        """Submit the job (once per cluster) and wait until it runs."""
        opts = self.config.launcher_options
        if self.allocation is None:
            name = f"jaxsys-{self.ipp.cluster_id}" if self.ipp is not None else "jaxsys"
            self.allocation = SlurmAllocation(
                name=name,
                ntasks=self.config.nprocs,
                script_dir=ctx.profile,
                options=opts,
                job_id=opts.get("job_id"),
            )
            self.allocation.submit()
        try:
            return self.allocation.wait_running(report, timeout=opts.get("queue_timeout"))
        except AllocationEndedError as e:
            tail = self.allocation.output_tail()
            if tail:
                raise AllocationEndedError(f"{e}; its output ends with:\n{tail}") from None
            raise

    def launch_options(self) -> dict[str, Any]:
        # The engines run as one step of the job: srun is ipyparallel's mpiexec here.
        return {"mpi_cmd": self.allocation.step_command(self.config.nprocs)}

    def kill_remote(self, engine_sets, processes=()) -> None:
        """SIGKILL the engines' job steps (Slurm ends every process of a step, what cells
        started included); the job itself stays for the next world."""
        if self.allocation is not None and self.allocation.job_id:
            kill_steps(self.allocation.job_id)

    def release(self) -> None:
        """Cancel the job (the hosts go back to Slurm), unless it was given by its id or
        kept."""
        super().release()
        alloc, self.allocation = self.allocation, None
        if alloc is not None and not self.config.launcher_options.get("job_id") and not self._kept:
            alloc.cancel()

    def keep_allocation(self) -> SlurmAllocation | None:
        """Keep the job past the cluster's teardown and this process's death (its
        watchdog goes); the engines still stop. Returns the job, or None before one runs."""
        alloc = self.allocation
        if alloc is None or alloc.job_id is None:
            return None
        alloc.keep()
        self._kept = True
        return alloc

    def process_gone(self, p) -> bool:
        # One squeue call every JOB_POLL_S at most, however many processes ask.
        alloc = self.allocation
        if alloc is None:
            return False
        now = time.monotonic()
        if now - self._last_poll > JOB_POLL_S:
            self._last_poll = now
            with contextlib.suppress(ClusterStartError, OSError, subprocess.SubprocessError):
                alloc.poll()
        return alloc.last.state.terminal

    def death_reason(self, p) -> str:
        alloc = self.allocation
        if alloc is not None and alloc.last.state.terminal:
            return f"{alloc.describe_job()} ended: {alloc.last.describe()}"
        return super().death_reason(p)
