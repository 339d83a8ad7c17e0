"""The Slurm launcher: every rank in one Slurm job; ranks come from Slurm's environment."""

from __future__ import annotations

from .base import Launcher


class SlurmLauncher(Launcher):
    """Every rank in one Slurm job; ranks come from Slurm's environment."""

    name = "slurm"
