"""``%jaxsys`` and schedulers: the cluster options a ``start`` line gives (the scheduler's
among them), the job line of ``status``, ``attach`` (a cluster in a job that runs
already, given by its id or kept from an earlier kernel) and ``stop --keep-allocation``."""

from __future__ import annotations

import argparse
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from .. import contract
from ..cluster.allocation import (
    check_name,
    forget_saved,
    load_saved,
    save_allocation,
    saved_file,
    state_dir,
)
from ..cluster.allocation_hosts import KeptHosts, forget_lapsed
from ..cluster.config import ClusterConfig
from ..cluster.launchers.registry import describe, launcher_class, names_where
from ..cluster.lease import LeaseHeldError
from ..errors import ConfigError

# What session.start has always been handed, given on the line or not (None: the
# kernelspec's value, or the declared default, decides).
_ALWAYS: dict[str, Any] = {
    "hosts": None,
    "devices_per_host": None,
    "launcher": None,
    "cache_dir": None,
    "init_timeout": None,
    "secure": None,
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
    """What the cluster's engines run on: ``job 12: running on host0,host1`` in a
    scheduler's job, ``allocation: this machine, running on h`` otherwise; None without
    one."""
    job = cluster.job()
    if not job:
        return None
    if job.get("job_id"):
        return f"job {job['job_id']}: {job['state']}"
    return f"allocation: {job.get('allocation', 'the hosts')}, {job['state']}"


def keep_allocation(session, name: str | None = None) -> str:
    """Before ``%jaxsys stop --keep-allocation``: keep the cluster's job past the stop (and
    past this kernel, for its lease's TTL), saved with the cluster's options for
    ``%jaxsys attach`` under ``name`` (None: the unnamed one).

    Returns
    -------
    str
        What was kept, and how to use it or give it back.

    Raises
    ------
    UsageError
        When no cluster runs, its launcher holds nothing that outlives it, or ``name`` is
        not a name.
    """
    cluster = session.require_cluster()
    launcher = cluster.world.launcher
    alloc = getattr(launcher, "allocation", None)
    if isinstance(alloc, KeptHosts):
        # Hosts that are simply there: kept under a key of their own, on a lease.
        forget_lapsed()
        alloc.name_key()
        alloc.saved_as = name
    if alloc is None or getattr(alloc, "job_id", None) is None:
        able = names_where(_attaches)
        raise UsageError(
            f"the {cluster.config.launcher} launcher holds nothing that outlives its engines "
            f"(only {describe(able)} keeps what its engines run on); use %jaxsys stop"
        )
    try:
        path = save_allocation(alloc, _saved_options(cluster), name)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(
            f"{alloc.describe_job()} cannot be kept: saving it in {state_dir()} failed "
            f"({e.strerror or e}); it ends with the cluster. Set JAXSYS_STATE_DIR to a "
            "directory you can write"
        ) from None
    # Marked kept only once saved: a job nothing could find again would never be cancelled.
    launcher.keep_allocation()
    again = "%jaxsys attach" + (f" --name {name}" if name else "")
    return alloc.kept_note(path, again, cluster.config.nprocs)


def _attaches(kind) -> bool:
    """Whether a launcher keeps what its engines run on for an attach (its allocation's
    kind): a scheduler's job, or hosts kept under a key."""
    return kind.allocation_kind is not None


def _takes_job_ids(kind) -> bool:
    """Whether a launcher starts engines in a job given by its id (``%jaxsys attach JOB``)."""
    return _attaches(kind) and getattr(kind.allocation_kind, "takes_job_ids", True)


def _saved_options(cluster) -> dict[str, Any]:
    """The cluster's options as saved for an attach: those given, and its size, which a
    later kernel's defaults must not decide."""
    cfg = cluster.config
    hosts = cfg.host_names or cfg.nprocs
    return {
        **cfg.to_dict(),
        "launcher": cfg.launcher,
        "hosts": hosts,
        "devices_per_host": cfg.devices_per_host,
    }


def stop_note(cluster) -> str | None:
    """After a stop: a line saying what became of the job the cluster was attached to (a
    Slurm job is still there), or None."""
    config = getattr(cluster, "config", None)  # None: no cluster (or one without options)
    job_id = config.launcher_options.get("job_id") if config is not None else None
    if not job_id:
        return None
    return launcher_class(config.launcher).attached_stop_note(job_id)


def _saved_job(name: str | None) -> tuple[str, dict[str, Any]]:
    """The job a stop kept (its id) and the options of the cluster it ran, checked to be
    still there.

    Raises
    ------
    UsageError
        When nothing is saved, or the saved job has ended (the file is then forgotten).
    """
    saved = load_saved(name)
    if saved is None or saved[0].job_id is None:
        raise UsageError(
            f"no saved job to attach to ({saved_file(name)} holds none): give a job id "
            "(%jaxsys attach JOB), or keep a cluster's job with %jaxsys stop --keep-allocation"
        )
    alloc, options = saved
    status = alloc.poll()
    if status.state.terminal:
        forget_saved(name)
        forget_lapsed()  # kept hosts' leases, lapsed, go with them
        launcher = options.get("launcher")
        raise UsageError(
            f"the saved {alloc.describe_job()} is {status.describe()}: nothing to attach to; "
            f"start a new cluster (%jaxsys start{f' --launcher {launcher}' if launcher else ''} "
            "...)"
        )
    options.setdefault("hosts", getattr(alloc, "ntasks", None) or max(1, len(status.hosts)))
    return alloc.job_id, options


@magic_arguments("jaxsys attach")
@argument(
    "job_id",
    nargs="?",
    metavar="JOB",
    help="the running Slurm job, or kept Kubernetes world (NAMESPACE/NAME), to start the "
    "engines in (default: the one a stop kept)",
)
@argument("--hosts", type=int, default=None, metavar="N", help="processes (default: 1 per task)")
@argument("--devices-per-host", type=int, default=None, metavar="D", help="CPU devices each")
@argument("--name", default=None, metavar="NAME", help="the kept job of that name")
def attach(session, args: argparse.Namespace) -> None:
    """Start the cluster's engines in a Slurm job that is already running.

    Nothing is queued: the engines run as a step of job ``JOB`` (for instance one that
    ``salloc`` or ``sbatch`` made, or one that ``jaxsys cluster start --launcher slurm``
    holds). Without ``JOB``, the job that ``%jaxsys stop --keep-allocation`` kept (or the
    last one attached to), in this kernel or an earlier one, with the options of the
    cluster that ran in it; ``--name`` picks one of several kept jobs. Stopping the
    cluster stops the engines and leaves the job running, kept for the next attach.

    One kernel at a time: the kernel holds the job's lease while it lives, and another
    live kernel is refused, told which process holds it. A job that jaxsys submitted is
    cancelled once its lease lapses (its kernel gone, and nobody attached within the
    lease's TTL, ``JAXSYS_LEASE_TTL`` seconds, 45 by default); in a job of your own, only
    the engines' steps end then.

    A cluster on this machine or on named hosts, kept with ``%jaxsys stop
    --keep-allocation``, keeps its hosts and options (its processes stop, as every process
    ends with its kernel): ``%jaxsys attach`` starts a cluster of the same shape on them
    again, within the lease's TTL of the end of the kernel that kept them. A plain
    ``%jaxsys stop`` gives them back.

    A kept Kubernetes world keeps its pods: ``%jaxsys attach`` (``JOB``: ``NAMESPACE/NAME``)
    finds it by its labels and starts new engines in them within the lease's TTL of the
    keep. A plain stop deletes it; a dead kernel's world ends a TTL after its engines.

    Examples
    --------
    ::

        %jaxsys attach 1234 --hosts 4
        %jaxsys stop --keep-allocation
        %jaxsys attach
        %jaxsys attach --name big-run
        %jaxsys attach ml/jaxsys-1a2b-1
    """
    # The launchers that start engines in a running job: those with an allocation kind.
    # Asked first: loading the launchers registers the allocation kinds a saved job names.
    able = names_where(_attaches)
    options: dict[str, Any] = {}
    try:
        name = check_name(args.name)
        if args.job_id is None:
            job_id, options = _saved_job(name)
        kind = _attaching(options.get("launcher"), able, args.job_id)
        if args.job_id is not None:
            job_id = args.job_id
            options["hosts"] = _running_job_size(kind, job_id)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    # One kernel at a time: refused before anything starts, naming the holder.
    held = kind.attach_refusal(job_id)
    if held:
        raise UsageError(held)
    given = {"hosts": args.hosts, "devices_per_host": args.devices_per_host}
    options.update({k: v for k, v in given.items() if v is not None})
    if not _takes_job_ids(kind):
        _attach_hosts(session, name, options)
    else:
        _attach_job(session, kind, job_id, name, options)


def _attach_job(session, kind, job_id: str, name: str | None, options: dict[str, Any]):
    """Start a cluster in the job ``job_id`` of the launcher ``kind``, and save it under
    ``name`` for the next attach."""
    launcher_options = {**options.get("launcher_options", {}), "job_id": job_id}
    options.update(launcher=kind.name, launcher_options=launcher_options)
    session.start(**options)
    # Kept for the next attach: the job outlives this cluster, and this kernel by its
    # lease's TTL.
    job = kind.job_allocation(job_id, ntasks=options["hosts"], options=launcher_options)
    save_allocation(job, options, name)


def _running_job_size(kind, job_id: str) -> int:
    """The processes an attach to the job ``job_id`` starts by default: one per node.

    Raises
    ------
    UsageError
        When the job has ended.
    """
    alloc = kind.job_allocation(job_id)
    status = alloc.poll()
    if status.state.terminal:
        raise UsageError(f"{alloc.describe_job()} is {status.describe()}: nothing to attach to")
    return max(1, len(status.hosts))


def _attaching(saved: str | None, able: list[str], job_id: str | None = None):
    """The launcher class an attach starts engines with: the saved cluster's, else the
    one launcher that attaches to jobs given by their id (that can name ``job_id``).

    Raises
    ------
    UsageError
        When there is no such launcher, or several and nothing says which.
    """
    if saved in able:
        return launcher_class(saved)
    by_id = [n for n in able if _takes_job_ids(launcher_class(n))]
    if job_id is not None and len(by_id) > 1:
        refused = {}
        for n in by_id:
            try:
                launcher_class(n).job_allocation(job_id)
            except ConfigError as e:
                refused[n] = str(e)
        if len(refused) == len(by_id):
            raise UsageError("; ".join(refused.values()))
        by_id = [n for n in by_id if n not in refused]
    if len(by_id) != 1:
        raise UsageError(f"attach needs one launcher that takes a job id, not {describe(by_id)}")
    return launcher_class(by_id[0])


def _attach_hosts(session, name: str | None, options: dict[str, Any]) -> None:
    """Start a cluster on the hosts a stop kept under ``name``, holding their lease while
    it runs (another kernel is refused meanwhile).

    Raises
    ------
    UsageError
        When another live kernel runs a cluster on them.
    """
    saved = load_saved(name)
    if saved is None or not isinstance(saved[0], KeptHosts):
        raise UsageError(f"no kept hosts in {saved_file(name)}: keep a cluster's first")
    alloc = saved[0]
    alloc.saved_as = name
    try:
        alloc.attach()
    except LeaseHeldError as e:
        raise UsageError(str(e)) from None
    try:
        session.start(**options)
    except BaseException:
        # Kept again, for another try: nothing ran on them.
        alloc.keep()
        raise
    session.require_cluster().world.launcher.hold(alloc)
