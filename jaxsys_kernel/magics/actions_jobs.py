"""``%jaxsys`` and schedulers: the options ``start`` passes to a scheduler's launcher, the
job line of ``status``, and ``attach`` (a cluster in a job that runs already)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from ..cluster.allocation_slurm import SlurmAllocation

# The flags of %jaxsys start that become launcher options, by option name.
_SCHEDULER_FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--partition", {"metavar": "P", "help": "Slurm: the partition to queue in"}),
    ("--time", {"metavar": "T", "help": "Slurm: the job's time limit, e.g. 30:00"}),
    ("--account", {"metavar": "A", "help": "Slurm: the account charged"}),
    (
        "--sbatch-arg",
        {
            "action": "append",
            "default": [],
            "metavar": "ARG",
            "help": "Slurm: one more sbatch option, e.g. --sbatch-arg=--ntasks-per-node=1",
        },
    ),
    ("--hostfile", {"metavar": "F", "help": "MPI: spread the ranks over the hosts F names"}),
)


def scheduler_arguments(func: Callable) -> Callable:
    """Add the scheduler flags to a ``magic_arguments`` function (place it among its
    ``@argument`` lines)."""
    for flag, kwargs in reversed(_SCHEDULER_FLAGS):
        func = argument(flag, **{"default": None, **kwargs})(func)
    return func


def launcher_options(args: argparse.Namespace) -> dict[str, Any]:
    """``{"launcher_options": {...}}`` for the scheduler flags given, or ``{}``."""
    opts: dict[str, Any] = {}
    for key in ("partition", "time", "account", "hostfile"):
        if getattr(args, key, None):
            opts[key] = getattr(args, key)
    if getattr(args, "sbatch_arg", None):
        opts["sbatch_args"] = list(args.sbatch_arg)
    return {"launcher_options": opts} if opts else {}


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
    if not args.job_id.isdigit():
        raise UsageError(f"JOB must be a Slurm job id (digits), not {args.job_id!r}")
    status = SlurmAllocation(job_id=args.job_id).poll()
    if status.state.terminal:
        raise UsageError(f"Slurm job {args.job_id} is {status.describe()}: nothing to attach to")
    hosts = args.hosts if args.hosts is not None else max(1, len(status.hosts))
    session.start(
        hosts=hosts,
        devices_per_host=args.devices_per_host,
        launcher=SlurmAllocation.kind,
        launcher_options={"job_id": args.job_id},
    )
