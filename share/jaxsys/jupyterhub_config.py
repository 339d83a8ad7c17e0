# JupyterHub configuration for JupyterLab in Slurm jobs with the jaxsys kernel: batchspawner's
# SlurmSpawner, a callback that accepts a port only, the site's choices from JAXSYS_HUB_*
# variables (docs/lab-on-slurm.md). Add the site's authenticator below, or load this file
# from the site's own configuration with load_subconfig().
from jaxsys_kernel.hub.config import configure

configure(get_config())  # noqa: F821  (JupyterHub defines get_config)
