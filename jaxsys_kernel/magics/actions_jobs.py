"""``%jaxsys`` and schedulers: the cluster options a ``start`` line gives (the scheduler's
among them), the job line of ``status``, and ``attach`` (a cluster in a job that runs
already)."""

from __future__ import annotations

import argparse
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from .. import contract
from ..cluster.allocation_slurm import SlurmAllocation
from ..cluster.config import ClusterConfig
from ..cluster.launchers.registry import describe, names_where

# What session.start has always been handed, given on the line or not (None: the
# kernelspec's value, or the declared default, decides).
_ALWAYS: dict[str, Any] = {
    "hosts": None,
    "devices_per_host": None,
    "launcher": None,
    "cache_dir": None,
    "init_timeout": 60.0,
    "secure": True,
    "ca_file": None,
    "cert_dir": None,
}


def line_options(args: argparse.Namespace) -> dict[str, Any]:
    """The cluster options a ``%jaxsys start`` line gives: its layer of the settings.

    Raises
    ------
    UsageError
        For ``--devices-per-host`` below 1.
    ConfigError
        For an ``--env`` without ``=``.
    """
    given = ClusterConfig.given(args)
    if given.get("devices_per_host", 1) < 1:
        raise UsageError("--devices-per-host must be at least 1")
    env = dict(given.pop("env", {}))
    if getattr(args, "transfer_ports", False):
        env[contract.TRANSFER_PORTS] = "1"
    return {**_ALWAYS, **given, "env": env}


def launcher_options(args: argparse.Namespace) -> dict[str, Any]:
    """``{"launcher_options": {...}}`` for the scheduler flags given, or ``{}``."""
    given = ClusterConfig.given(args).get("launcher_options")
    return {"launcher_options": given} if given else {}


def job_line(cluster) -> str | None:
    """``job 12: running on host0,host1`` for a cluster in a scheduler's job, else None."""
    job = cluster.job()
    if not job:
        return None
    return f"job {job['job_id']}: {job['state']}"


@magic_arguments("jaxsys attach")
@argument("job_id", metavar="JOB", help="the running Slurm job to start the engines in")
@argument("--hosts", type=int, default=None, metavar="N", help="processes (default: 1 per task)")
@argument("--devices-per-host", type=int, default=None, metavar="D", help="CPU devices each")
def attach(session, args: argparse.Namespace) -> None:
    """Start the cluster's engines in a Slurm job that is already running.

    Nothing is queued: the engines run as a step of job ``JOB`` (for instance one that
    ``salloc`` or ``sbatch`` made, or one that ``jaxsys cluster start --launcher slurm``
    holds). Stopping the cluster stops the engines and leaves the job to its owner.

    Examples
    --------
    ::

        %jaxsys attach 1234 --hosts 4
    """
    # The launcher that starts engines in a running job: the one that takes a job's id.
    able = names_where(lambda k: k.takes_options and "job_id" in k.option_names()[1])
    if len(able) != 1:
        raise UsageError(f"attach needs one launcher that takes a job id, not {describe(able)}")
    if not args.job_id.isdigit():
        raise UsageError(f"JOB must be a Slurm job id (digits), not {args.job_id!r}")
    status = SlurmAllocation(job_id=args.job_id).poll()
    if status.state.terminal:
        raise UsageError(f"Slurm job {args.job_id} is {status.describe()}: nothing to attach to")
    hosts = args.hosts if args.hosts is not None else max(1, len(status.hosts))
    session.start(
        hosts=hosts,
        devices_per_host=args.devices_per_host,
        launcher=able[0],
        launcher_options={"job_id": args.job_id},
    )
