"""The Slurm job the kernel itself runs in, for ``%jaxsys status`` and ``%jaxsys security``.

A JupyterLab started by JupyterHub (batchspawner) or Open OnDemand runs in a Slurm job, and
so do its kernels. Processes started on this machine share that job's CPUs, and other users'
jobs on the same node can connect to JAX's data plane, which has no authentication. This
module reads the job from the kernel's environment and, for a shared node, asks Slurm who
else runs there; it says both in one line each.
"""

from __future__ import annotations

import getpass
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from .slurm_watch import run_slurm

# A job id as Slurm prints it (12, 12_3 for an array task, 12+1 for a heterogeneous part).
_JOB_ID = re.compile(r"^\d{1,12}([_+]\d{1,12})?$")
# Other users named in a line, at most; and characters kept of each name.
_NAMED_USERS = 3
_NAME_CHARS = 32


@dataclass(frozen=True)
class EnclosingJob:
    """The kernel's own Slurm job.

    Attributes
    ----------
    job_id : str
    node : str
        This machine's node name.
    cpus : int or None
        CPUs the job holds on this node (``SLURM_CPUS_ON_NODE``).
    nodes : str
        The job's node list as Slurm writes it.
    """

    job_id: str
    node: str
    cpus: int | None
    nodes: str


def enclosing_job(environ: Mapping[str, str] | None = None) -> EnclosingJob | None:
    """The Slurm job this process runs in, from its environment; None outside one.

    Examples
    --------
    >>> enclosing_job({"SLURM_JOB_ID": "12", "SLURM_CPUS_ON_NODE": "2",
    ...                "SLURMD_NODENAME": "n1"}).cpus
    2
    """
    env = os.environ if environ is None else environ
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if not _JOB_ID.match(job_id):
        return None
    cpus_text = env.get("SLURM_CPUS_ON_NODE", "").strip()
    cpus = int(cpus_text) if cpus_text.isdigit() and len(cpus_text) < 7 else None
    node = (env.get("SLURMD_NODENAME") or socket.gethostname())[:64]
    return EnclosingJob(job_id, node, cpus, (env.get("SLURM_JOB_NODELIST") or node)[:200])


def _runs_here(job: EnclosingJob, cluster_job: dict | None) -> bool:
    """Whether the cluster's processes run on this node inside the kernel's job."""
    if not cluster_job:
        return False
    nodes = set(cluster_job.get("nodes") or [])
    here = {job.node, socket.gethostname()}
    return cluster_job.get("job_id") in (None, job.job_id) and bool(nodes) and nodes <= here


def status_line(cluster, environ: Mapping[str, str] | None = None) -> str | None:
    """``kernel: in Slurm job 12 (2 CPUs on n1)``, and whether the cluster's processes fit
    those CPUs; None outside a Slurm job.

    Examples
    --------
    ::

        kernel: in Slurm job 12 (2 CPUs on n1); 4 processes x 2 devices run on this node
        and share its 2 CPUs: start fewer (%jaxsys start --hosts 2) or give them a job
        of their own (--launcher)
    """
    job = enclosing_job(environ)
    if job is None:
        return None
    cpus = f"{job.cpus} CPUs" if job.cpus else "its CPUs"
    line = f"kernel: in Slurm job {job.job_id} ({cpus} on {job.node})"
    try:
        cluster_job = cluster.job()
        n, d = cluster.nprocs, cluster.devices_per_host
    except Exception:  # noqa: BLE001  (a stopped or broken cluster: the job line alone)
        return line
    if job.cpus and _runs_here(job, cluster_job) and n > job.cpus:
        line += (
            f"; {n} processes x {d} devices run on this node and share its {job.cpus} CPUs: "
            f"start fewer (%jaxsys start --hosts {job.cpus}) or give them a job of their "
            "own (--launcher)"
        )
    return line


def other_users_on_node(job: EnclosingJob) -> list[str] | None:
    """Users other than this one with a running job on this node; None when Slurm does not
    answer."""
    r = run_slurm(["squeue", "-h", "-t", "RUNNING", "-w", job.node, "-o", "%u"])
    if r is None or r.returncode != 0:
        return None
    me = getpass.getuser()
    return sorted({u.strip()[:_NAME_CHARS] for u in r.stdout.splitlines() if u.strip()} - {me})


def shared_node_line(environ: Mapping[str, str] | None = None) -> str | None:
    """One line when the kernel's job shares its node with other users' jobs (or Slurm
    cannot say): they can reach JAX's data plane; None outside a job or on a node of one's
    own.

    Examples
    --------
    ::

        shared node: other users' jobs run on n1 (bob): they can connect to JAX's data
        plane, which has no authentication; ask for exclusive nodes (sbatch --exclusive)
    """
    job = enclosing_job(environ)
    if job is None:
        return None
    others = other_users_on_node(job)
    if others == []:
        return None
    who = (
        "(Slurm did not answer who else runs there)"
        if others is None
        else "(" + ", ".join(others[:_NAMED_USERS]) + (", ..." if len(others) > 3 else "") + ")"
    )
    return (
        f"shared node: other users' jobs may run on {job.node} {who}: they can connect to "
        "JAX's data plane, which has no authentication; ask for exclusive nodes "
        "(sbatch --exclusive)"
    )
