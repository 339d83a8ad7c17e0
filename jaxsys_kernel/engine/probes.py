"""Small functions the kernel applies on engines: value transfer, completion, inspection."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from IPython import get_ipython

# Also used on the kernel side (the audit of its own sockets), so it lives in a module
# without JAX; engines read it from here as before.
from .sockets import listening_sockets


def _jax_leaves(value: Any) -> tuple[list, bool]:
    """Leaves of ``value`` if it is a pytree holding jax arrays, and whether any spans processes."""
    # Deferred: this module loads without JAX (completion, inspection and network_endpoints
    # run where JAX may not be imported); describe_value reads an ImportError as no arrays.
    import jax

    leaves = jax.tree.leaves(value)
    arrays = [leaf for leaf in leaves if isinstance(leaf, jax.Array)]
    return arrays, any(not a.is_fully_addressable for a in arrays)


def describe_value(value: Any) -> dict:
    """Say how a value can be brought to the kernel.

    Returns
    -------
    dict
        ``kind`` is ``global`` (holds arrays spanning processes: every process must take
        part in the gather), ``arrays`` (holds only local jax arrays) or ``object``;
        ``type`` is the value's type name and ``shapes`` the global shapes of its arrays.
    """
    try:
        arrays, spans = _jax_leaves(value)
    except ImportError:
        arrays, spans = [], False
    kind = "global" if spans else ("arrays" if arrays else "object")
    return {
        "kind": kind,
        "type": f"{type(value).__module__}.{type(value).__qualname__}",
        "shapes": [list(a.shape) for a in arrays],
    }


def fetch_value(value: Any, want: int) -> Any:
    """Return ``value`` with every jax array replaced by a full numpy array.

    Arrays that span processes are gathered with ``process_allgather``, a collective: call
    this on every process at once. Only process ``want`` returns the value; the others
    return None so that nothing else travels.

    Parameters
    ----------
    value : Any
        The value named by the user, resolved in the engine's namespace.
    want : int
        The process whose copy is returned.
    """
    # Deferred: as in _jax_leaves, this module loads without JAX.
    import jax
    from jax.experimental import multihost_utils

    def to_numpy(leaf):
        if isinstance(leaf, jax.Array):
            if leaf.is_fully_addressable:
                return np.asarray(leaf)
            return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        return leaf

    converted = jax.tree.map(to_numpy, value)
    if jax.process_index() != want:
        return None
    module = type(converted).__module__ or ""
    if module.split(".")[0] in ("jax", "jaxlib"):
        raise TypeError(
            f"{type(converted).__qualname__} is a JAX object that only lives on the engines; "
            "pull arrays or plain Python values (use print() to see this one)"
        )
    return converted


#: At most this many names answer :func:`user_names` (the kernel bounds them again).
USER_NAMES_LIMIT = 2000


def user_names() -> list[str]:
    """The names the user defined in this engine's namespace, sorted, at most
    :data:`USER_NAMES_LIMIT` (IPython's own and underscore names left out).

    The kernel compares them across processes to tell what a restarted process lacks.
    """
    shell = get_ipython()
    hidden = shell.user_ns_hidden
    names = sorted(
        k
        for k in shell.user_ns
        if isinstance(k, str)
        and not k.startswith("_")
        and k not in hidden
        and k not in ("In", "Out", "exit", "quit", "get_ipython")
    )
    return names[:USER_NAMES_LIMIT]


def complete(code: str, cursor_pos: int) -> dict:
    """Completions from this engine's namespace, in the kernel protocol's reply format."""
    kernel = get_ipython().kernel
    reply = kernel.do_complete(code, cursor_pos)
    return dict(reply)


def inspect(code: str, cursor_pos: int, detail_level: int = 0) -> dict:
    """Inspection of the name at the cursor, in the kernel protocol's reply format."""
    kernel = get_ipython().kernel
    return dict(kernel.do_inspect(code, cursor_pos, detail_level))


def network_endpoints() -> dict:
    """What this JAX process listens on, and the JAX settings that open sockets.

    Returns
    -------
    dict
        ``listening``: ``[host, port]`` pairs of this process's listening TCP sockets;
        ``heartbeat_monitor``: the port of ipyparallel's heartbeat monitor among them (or
        None); ``nanny``: the pid and the listening pairs of the engine's nanny process
        (None without one); ``cross_host_transfer``: the configured transfer socket
        address (or ""); ``profiler``: whether ``jax.profiler.start_server`` was called.
    """
    # Deferred: _compat reaches into ipyparallel's engine, which only an engine has.
    from .. import _compat

    nanny = _compat.nanny_pid()
    transfer, profiler = "", False
    if "jax" in sys.modules:
        # Deferred: imported only when this process already has it (the check above).
        import jax

        # An absl-style flag: jax.config has no attribute for it, its holder has the value.
        bridge = sys.modules.get("jax._src.xla_bridge")
        holder = getattr(bridge, "CROSS_HOST_TRANSFER_SOCKET_ADDRESS", None)
        transfer = getattr(holder, "value", None) or getattr(
            jax.config, "jax_cross_host_transfer_socket_address", ""
        )
        prof = sys.modules.get("jax._src.profiler")
        profiler = getattr(prof, "_profiler_server", None) is not None
    return {
        "listening": [list(x) for x in listening_sockets()],
        "heartbeat_monitor": _compat.engine_heartbeat_monitor_port(),
        "nanny": None
        if nanny is None
        else {"pid": nanny, "listening": [list(x) for x in listening_sockets(nanny)]},
        "cross_host_transfer": transfer,
        "profiler": profiler,
    }
