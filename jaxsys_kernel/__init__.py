"""jaxsys: a Jupyter kernel for multi-controller JAX.

The kernel drives one ipyparallel engine per host; each engine is one JAX process.
Nothing here imports JAX: the kernel is a driver, and the engines own the devices.
"""

import importlib

from ._version import __version__
from .errors import JaxsysError

__all__ = [
    "Cluster",
    "ClusterError",
    "ClusterStartError",
    "JaxsysError",
    "__version__",
    "live_devices",
    "load_exported",
    "load_ipython_extension",
    "save_exported",
    "session",
    "show",
]


def live_devices(devices=None):
    """The devices whose processes are alive, as a context manager (inside ``%%multihost``).

    A thin wrapper of ``jax.experimental.multihost_utils.live_devices`` for clusters that
    run with recoverability (the jaxsys default). Every process must enter it the same
    number of times: entering yields the live set agreed at the previous exit, and exiting
    is a barrier among the live processes that raises ``ProcessFailureError`` (with
    ``failed_devices``) when a process died during the block.

    Parameters
    ----------
    devices : list of jax.Device, optional
        The devices to watch; all of them by default.

    Examples
    --------
    ::

        %%multihost
        import jaxsys_kernel
        with jaxsys_kernel.live_devices() as devices:
            mesh = jax.sharding.Mesh(np.array(devices), ("x",))
    """
    # Deferred: nothing here imports JAX (the kernel imports this package); this runs on engines.
    import jax
    from jax.experimental import multihost_utils

    return multihost_utils.live_devices(jax.devices() if devices is None else devices)


def show(x):
    """Show the view of a mesh, a sharding, a jax.Array or an export (in ``%%multihost``).

    Parameters
    ----------
    x : Mesh, NamedSharding, jax.Array, jax.export.Exported or DataPlan
        The object to draw; arrays may span processes; an export gets its artifact card;
        a :func:`jaxsys_kernel.data.plan` shows which process reads which block.

    Examples
    --------
    ::

        %%multihost
        import jaxsys_kernel
        jaxsys_kernel.show(mesh)
    """
    # Deferred, like every name here: importing jaxsys_kernel must stay cheap on engines.
    from .engine.display import show as _show

    _show(x)


def session():
    """The kernel's jaxsys session: the running cluster and its state (in the kernel only).

    ``session().cluster`` is the :class:`Cluster` that ``%jaxsys start`` started (None
    before), with its PKI, telemetry hub, coordinator address and refusals.

    Returns
    -------
    jaxsys_kernel.magics.MultihostSession

    Raises
    ------
    RuntimeError
        Outside a jaxsys kernel (or an IPython shell with ``%load_ext jaxsys_kernel``).

    Examples
    --------
    ::

        import jaxsys_kernel
        cluster = jaxsys_kernel.session().cluster
        print(cluster.coordinator_address)
    """
    # Deferred: the magics need IPython, which an engine importing this package may lack.
    from .magics import current_session

    return current_session()


def __getattr__(name):
    if name in ("Cluster", "ClusterError", "ClusterStartError"):
        # Deferred, so that engines importing jaxsys_kernel.engine do not load the cluster code.
        from . import cluster

        return getattr(cluster, name)
    if name in ("save_exported", "load_exported"):
        # Deferred: they run where JAX runs (engines), and importing export imports JAX.
        from . import export

        return getattr(export, name)
    if name in _SUBPACKAGES:
        # Subpackages load on first use (``jaxsys_kernel.data.global_batch``), as after
        # ``import jaxsys_kernel.data``.
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(
        f"module 'jaxsys_kernel' has no attribute {name!r}; its public names are "
        f"{', '.join(sorted(__all__))} and the subpackages {', '.join(_SUBPACKAGES)}"
    )


_SUBPACKAGES = (
    "data",
    "engine",
    "widgets",
    "cluster",
    "cells",
    "telemetry",
    "magics",
    "errors",
    "examples",
)


def load_ipython_extension(ipython):
    """Register the jaxsys magics in an IPython shell (``%load_ext jaxsys_kernel``).

    Parameters
    ----------
    ipython : IPython.core.interactiveshell.InteractiveShell
        The shell to extend.

    Raises
    ------
    jaxsys_kernel._compat.IncompatibleVersion
        If the installed ipyparallel or ipykernel is not a release jaxsys supports.
    """
    # Deferred: only a shell loading the extension needs the version check and the magics.
    from . import _compat
    from .magics import register_magics

    _compat.check_versions()
    register_magics(ipython)


def _jupyter_labextension_paths():
    # Read by `jupyter labextension develop` only; installs get the extension as shared-data.
    return [{"src": "../labextension/prebuilt", "dest": "jaxsys"}]
