"""The jaxsys kernelspec: written for this Python, installable into any Jupyter prefix."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from jupyter_client.kernelspec import KernelSpecManager

from .. import contract
from ..cluster.config import ClusterConfig
from .logo import write_logos

KERNEL_NAME = "jaxsys"


def _declared(name: str) -> int:
    """The default :class:`~jaxsys_kernel.cluster.config.ClusterConfig` declares for ``name``."""
    return ClusterConfig.__dataclass_fields__[name].default


def kernel_spec(
    hosts: int | None = None, devices_per_host: int | None = None, python: str | None = None
) -> dict:
    """The ``kernel.json`` content for the jaxsys kernel.

    Parameters
    ----------
    hosts, devices_per_host : int, optional
        Defaults for clusters started by the kernel, written into the spec's environment
        (``contract.HOSTS``, ``contract.DEVICES_PER_HOST``); ``ClusterConfig``'s declared
        defaults when not given.
    python : str, optional
        Interpreter that runs the kernel; this one by default.
    """
    hosts = _declared("hosts") if hosts is None else hosts
    if devices_per_host is None:
        devices_per_host = _declared("devices_per_host")
    return {
        "argv": [python or sys.executable, "-m", "jaxsys_kernel", "-f", "{connection_file}"],
        "display_name": "jaxsys (multi-host JAX)",
        "language": "python",
        "interrupt_mode": "signal",
        "env": {contract.HOSTS: str(hosts), contract.DEVICES_PER_HOST: str(devices_per_host)},
        "metadata": {"debugger": False},
    }


def install_kernel_spec(
    prefix: str | None = None,
    user: bool = False,
    hosts: int | None = None,
    devices_per_host: int | None = None,
) -> str:
    """Install the jaxsys kernelspec and return the directory it was written to.

    Parameters
    ----------
    prefix : str, optional
        Install under ``PREFIX/share/jupyter/kernels``; defaults to ``sys.prefix`` unless
        ``user`` is set.
    user : bool
        Install for the current user instead.
    hosts, devices_per_host : int, optional
        Cluster defaults written into the spec's environment (see :func:`kernel_spec`).
    """
    if not user and prefix is None:
        prefix = sys.prefix
    with tempfile.TemporaryDirectory() as td:
        (Path(td) / "kernel.json").write_text(
            json.dumps(kernel_spec(hosts, devices_per_host), indent=2)
        )
        # The launcher tile's and kernel picker's pictures, the same as share/'s.
        write_logos(td)
        where = KernelSpecManager().install_kernel_spec(
            td, kernel_name=KERNEL_NAME, user=user, prefix=None if user else prefix, replace=True
        )
    _readable_by_all(Path(where))
    return where


def _readable_by_all(folder: Path) -> None:
    # The spec is copied from a private temporary folder (0700), whose mode the copy keeps:
    # on a shared install no other user's Jupyter would list the kernel.
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
