"""The hub's configuration: JupyterLab in Slurm jobs (batchspawner) with the jaxsys kernel.

``share/jaxsys/jupyterhub_config.py`` (installed under the environment's ``share/jaxsys``)
calls :func:`configure`; a site runs the hub with it (``jupyterhub -f``) or loads it from
its own configuration with ``load_subconfig`` and adds its authenticator there.
docs/lab-on-slurm.md explains the variables in :data:`SITE_VARIABLES`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from .callback import install

# The variables a site sets, with their defaults ("" leaves batchspawner's choice).
SITE_VARIABLES = {
    # Prefix of the Python environment the users' jobs run: jupyterhub-singleuser,
    # batchspawner and jaxsys installed there, `jaxsys install-kernel --prefix` done there,
    # readable by every user. Default: the hub's own environment.
    "JAXSYS_HUB_USER_ENV": sys.prefix,
    # How the hub runs sbatch, squeue and scancel as the user.
    "JAXSYS_HUB_EXEC_PREFIX": "sudo -E -u {username}",
    "JAXSYS_HUB_CPUS": "2",
    "JAXSYS_HUB_MEMORY": "",
    "JAXSYS_HUB_RUNTIME": "08:00:00",
    "JAXSYS_HUB_PARTITION": "",
    # One more #SBATCH line, e.g. --exclusive: other users' jobs on a shared node can reach
    # JAX's data plane, which has no authentication.
    "JAXSYS_HUB_SBATCH_OPTIONS": "",
}


def configure(c, environ: Mapping[str, str] | None = None) -> None:
    """Fill a JupyterHub config for Labs in Slurm jobs, with the safe callback installed.

    Parameters
    ----------
    c : traitlets.config.Config
        The hub's configuration (``get_config()`` in ``jupyterhub_config.py``).
    environ : mapping, optional
        Where the site's variables (:data:`SITE_VARIABLES`) are read; ``os.environ`` by
        default.

    Examples
    --------
    In ``jupyterhub_config.py``:

    >>> from jaxsys_kernel.hub.config import configure
    >>> configure(get_config())  # doctest: +SKIP
    """
    install()
    env = os.environ if environ is None else environ
    site = {k: env.get(k, default) for k, default in SITE_VARIABLES.items()}
    user_env = site["JAXSYS_HUB_USER_ENV"]
    c.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
    s = c.SlurmSpawner
    s.batchspawner_singleuser_cmd = os.path.join(user_env, "bin", "batchspawner-singleuser")
    s.cmd = [os.path.join(user_env, "bin", "jupyterhub-singleuser")]
    s.exec_prefix = site["JAXSYS_HUB_EXEC_PREFIX"]
    s.req_nprocs = site["JAXSYS_HUB_CPUS"]
    s.req_memory = site["JAXSYS_HUB_MEMORY"]
    s.req_runtime = site["JAXSYS_HUB_RUNTIME"]
    s.req_partition = site["JAXSYS_HUB_PARTITION"]
    s.req_options = site["JAXSYS_HUB_SBATCH_OPTIONS"]
    # A queue can be slow to start a job; the server itself is up seconds after it starts.
    s.start_timeout = 300
    s.http_timeout = 120
    s.default_url = "/lab"
    # sbatch and srun run from a kernel in the job find the same Slurm as the hub.
    if env.get("SLURM_CONF"):
        s.environment = {"SLURM_CONF": env["SLURM_CONF"]}
