"""ipyparallel's engine-set launcher for engines that run as one step of a Slurm job.

Imported only when a Slurm cluster starts: it imports ipyparallel's launchers.
"""

from __future__ import annotations

from ipyparallel.cluster.launcher import MPIEngineSetLauncher


class SrunEngineSetLauncher(MPIEngineSetLauncher):
    """``srun --jobid=J --ntasks=N ... python -m ipyparallel.engine``: one engine per task
    of a running job. ``mpi_cmd`` is the ``srun`` prefix (with the task count); each
    engine takes its rank from ``SLURM_PROCID``, so no ``--mpi`` (and no mpi4py) is needed.
    """

    @property
    def program(self):
        return self.engine_cmd

    def find_args(self):
        return [*self.mpi_cmd, *self.program, *self.program_args]
