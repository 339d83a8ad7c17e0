"""The set-up every process of a job gets: what a notebook's cluster gives its engines.

A cluster started from a notebook gives each engine mTLS certificates from a per-cluster
CA, a compilation cache directory, JAX's heartbeat timeout and recoverability
(``Launcher.engine_env``). :func:`job_setup` makes the same for a job from the same
options (``ClusterConfig``): a per-job CA and one certificate per process in the job's
directory (``OUT/pki``, keys 0600), and the variables each process sets before it imports
JAX. The CA's own key is not kept: the processes need only its certificate, and nothing
issues certificates for the job later. The files are named relative to the job's directory,
so that the directory can be moved or copied to a cluster as it is.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..cluster.config import ClusterConfig
from ..cluster.security import make_pki
from .program import PATH_VARIABLES, JobSetup, Program


def job_id(out: Path) -> str:
    """The job's name in its certificates' identities: ``job-`` and its directory's name."""
    return "job-" + (re.sub(r"[^A-Za-z0-9._-]", "-", out.name)[:100] or "job")


def job_setup(prog: Program, out: Path) -> JobSetup:
    """Certificates (unless ``--insecure``) and each process's variables, for ``prog``.

    Processes on hosts unknown until the job runs (Slurm's nodes, an MPI hostfile's) get
    the certificates a Slurm cluster's engines get: each names its process in its URI SAN
    (``spiffe://jaxsys.local/<job>/process/<i>``) with loopback as its host, and JAX,
    given the peer URI prefix, checks that identity, not the host name.

    Raises
    ------
    ConfigError
        For options that cannot work together (as ``%jaxsys start`` would refuse them).
    """
    cfg = ClusterConfig.of(None, prog.options, "the job's options")
    env: dict[str, str] = {}
    if cfg.recoverable:
        env["JAX_ENABLE_RECOVERABILITY"] = "1"
    if cfg.cache_dir:
        env["JAX_COMPILATION_CACHE_DIR"] = cfg.cache_dir
    env.update(cfg.env)
    process_env = {rank: dict(cfg.process_env.get(rank, {})) for rank in cfg.ranks}
    pki = None
    if cfg.secure:
        hosts = cfg.kind(cfg).certificate_hosts()
        pki = make_pki(out, job_id(out), cfg.nprocs, hosts, cfg.ca_file, cfg.cert_dir)
        if cfg.ca_file is None:
            # A new CA of this job's own: its key signed the certificates and is no more use.
            (out / "pki" / "ca.key").unlink(missing_ok=True)
        for rank in cfg.ranks:
            process_env[rank] = {**_relative(pki.env(rank), out), **process_env[rank]}
    return JobSetup(
        env=env,
        process_env={r: e for r, e in process_env.items() if e},
        init_timeout=float(cfg.init_timeout),
        heartbeat=None if cfg.heartbeat_timeout is None else float(cfg.heartbeat_timeout),
        cert_dir=None if pki is None else str(pki.cert_dir),
    )


def _relative(env: dict[str, str], out: Path) -> dict[str, str]:
    """``env`` with the files inside ``out`` named relative to it (others as they are)."""
    root = out.resolve()
    named = {}
    for name, value in env.items():
        path = Path(value).resolve() if name in PATH_VARIABLES else None
        inside = path is not None and path.is_relative_to(root)
        named[name] = os.path.relpath(path, root) if inside else value
    return named
