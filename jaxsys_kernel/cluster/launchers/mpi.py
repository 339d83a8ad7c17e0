"""The MPI launcher: every rank in one ``mpiexec`` job; ranks come from MPI's environment."""

from __future__ import annotations

from .base import Launcher


class MpiLauncher(Launcher):
    """Every rank in one ``mpiexec`` job; ranks come from MPI's environment."""

    name = "mpi"
