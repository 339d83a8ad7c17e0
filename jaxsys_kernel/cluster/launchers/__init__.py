"""Where engines run and how they are reached: one class per launcher kind, chosen once.

Nothing else in the package asks which kind a cluster uses: it asks its launcher.
"""

from __future__ import annotations

from .base import (
    HEARTBEAT_MISSES,
    HEARTBEAT_PERIOD_MS,
    EngineContext,
    Launcher,
    host_part,
    listen_addresses,
    native_log_file,
    stack_file,
)
from .local import LocalLauncher
from .mpi import MpiLauncher
from .registry import (
    DEFAULT,
    ENTRY_POINT_GROUP,
    UnknownLauncherError,
    launcher_class,
    launcher_classes,
    launcher_names,
)
from .remote import SSH_HEARTBEAT_MISSES, SshLauncher
from .slurm import SlurmLauncher

__all__ = [
    "DEFAULT",
    "ENTRY_POINT_GROUP",
    "HEARTBEAT_MISSES",
    "HEARTBEAT_PERIOD_MS",
    "SSH_HEARTBEAT_MISSES",
    "EngineContext",
    "Launcher",
    "LocalLauncher",
    "MpiLauncher",
    "SlurmLauncher",
    "SshLauncher",
    "UnknownLauncherError",
    "host_part",
    "launcher_class",
    "launcher_classes",
    "launcher_names",
    "listen_addresses",
    "make_launcher",
    "native_log_file",
    "stack_file",
    "telemetry_addresses",
]


def make_launcher(config) -> Launcher:
    """The launcher a validated :class:`~jaxsys_kernel.cluster.config.ClusterConfig` asks for."""
    return launcher_class(config.launcher)(config)


def telemetry_addresses(launcher: str, controller_ip: str | None) -> tuple[str, str]:
    """Where the kernel's telemetry socket listens, and the address engines connect to,
    for a cluster with this launcher: ``(bind, advertise)`` (see :func:`listen_addresses`).

    Parameters
    ----------
    launcher : str
        The cluster's launcher.
    controller_ip : str or None
        The ``controller_ip`` the cluster was given.
    """
    return listen_addresses(launcher_class(launcher).loopback_only, controller_ip)
