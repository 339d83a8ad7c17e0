"""jaxsys: a Jupyter kernel for multi-controller JAX.

The kernel drives one ipyparallel engine per host; each engine is one JAX process.
Nothing here imports JAX: the kernel is a driver, and the engines own the devices.
"""

from ._version import __version__

__all__ = [
    "Cluster",
    "ClusterError",
    "ClusterStartError",
    "__version__",
    "load_ipython_extension",
    "show",
]


def show(x):
    """Show the view of a mesh, a sharding or a jax.Array (inside a ``%%multihost`` cell).

    Parameters
    ----------
    x : jax.sharding.Mesh, jax.sharding.NamedSharding or jax.Array
        The object to draw; arrays may span processes.

    Examples
    --------
    ::

        %%multihost
        import jaxsys_kernel
        jaxsys_kernel.show(mesh)
    """
    from .engine.display import show as _show

    _show(x)


def __getattr__(name):
    # Lazy, so that engines importing jaxsys_kernel.engine do not pull in the cluster code.
    if name in ("Cluster", "ClusterError", "ClusterStartError"):
        from . import cluster

        return getattr(cluster, name)
    raise AttributeError(name)


def load_ipython_extension(ipython):
    """Register the jaxsys magics in an IPython shell (``%load_ext jaxsys_kernel``).

    Parameters
    ----------
    ipython : IPython.core.interactiveshell.InteractiveShell
        The shell to extend.
    """
    from .magics import register_magics

    register_magics(ipython)


def _jupyter_labextension_paths():
    return []
