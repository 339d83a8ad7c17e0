"""JupyterHub on Slurm for jaxsys: a safe batchspawner callback and a shipped configuration.

Nothing here is imported by the kernel: the hub's own ``jupyterhub_config.py`` loads
:mod:`jaxsys_kernel.hub.callback` (through the shipped ``jupyterhub_config.py`` in this
folder), in the hub's environment, where JupyterHub and batchspawner are installed.
"""
