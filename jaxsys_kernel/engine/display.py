"""Rich display of meshes, shardings, arrays and exports from inside a JAX process.

Each process's IPython gets a formatter for a jaxsys mime type, registered by type *name* so
that nothing imports JAX before the user does. The formatter emits a summary (see
:mod:`summaries`); the kernel turns it into a view. Arrays that span processes work too,
because the summary comes from the sharding's device-to-index map, never from the data.
"""

from __future__ import annotations

import weakref
from typing import Any

from IPython import get_ipython
from IPython.core.formatters import JSONFormatter
from IPython.display import display

from .. import contract
from . import summaries
from .state import STATE

MIME = contract.SUMMARY_MIME

# (module, class name) of the objects that get a view; NamedSharding is exported from
# jax.sharding and ArrayImpl from jaxlib in 0.12.
_TYPES = {
    ("jax._src.mesh", "Mesh"): "mesh",
    ("jax.sharding", "NamedSharding"): "sharding",
    ("jax._src.named_sharding", "NamedSharding"): "sharding",
    ("jaxlib._jax", "ArrayImpl"): "array",
    ("jax._src.array", "ArrayImpl"): "array",
    ("jax._src.export._export", "Exported"): "export",
    ("jaxsys_kernel.export", "LoadedExport"): "export",
    # Data-loading plans carry their own summary (engine code never imports jaxsys_kernel.data).
    ("jaxsys_kernel.data.planner", "DataPlan"): "dataplan",
}
# Exported computations also get a one-line text form: their dataclass repr spells out the
# serialized module byte by byte.
_TEXT_TYPES = [k for k, v in _TYPES.items() if v == "export"]


def _export_summary(x: Any) -> dict:
    # One display asks for the summary and the text form in turn: build the facts once.
    if STATE.last_export is not None and STATE.last_export[0]() is x:
        return STATE.last_export[1]
    # Deferred: export_info imports JAX, and the boot path loads this module before JAX is
    # imported; most displays are not exports.
    from .export_info import export_info

    info = export_info(x)
    try:
        STATE.last_export = (weakref.ref(x), info)
    except TypeError:
        STATE.last_export = None
    return info


def summarize(x: Any) -> dict | None:
    """The summary of a mesh, a named sharding or a jax.Array; None for anything else.

    A sharding alone has no array shape, so it is drawn over the smallest shape that gives
    every shard one element along each sharded dimension.
    """
    kind = _TYPES.get((type(x).__module__, type(x).__qualname__))
    if kind is None and hasattr(x, "devices_indices_map") and hasattr(x, "mesh"):
        kind = "sharding"
    if kind == "export":
        return _export_summary(x)
    if kind == "dataplan":
        return x.summary()
    if kind == "mesh":
        return summaries.mesh_info(x)
    if kind == "array":
        return summaries.sharding_info(x)
    if kind == "sharding":
        mesh_shape = dict(zip(x.mesh.axis_names, x.mesh.devices.shape, strict=True))
        shape = []
        for entry in x.spec:
            axes = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
            size = 1
            for axis in axes:
                size *= mesh_shape[axis]
            shape.append(size)
        return summaries.sharding_info((x, tuple(shape)))
    return None


def _format(x: Any) -> dict | None:
    try:
        return summarize(x)
    except Exception:  # noqa: BLE001 - a failed summary must never break printing the value
        return None


def register_formatters(shell=None) -> bool:
    """Teach this process's IPython to emit summaries for JAX meshes, shardings and arrays.

    Returns
    -------
    bool
        Whether a shell was there to register with.
    """
    shell = shell or get_ipython()
    if shell is None:
        return False
    formatters = shell.display_formatter.formatters
    if MIME not in formatters:
        formatter = JSONFormatter(parent=shell.display_formatter)
        formatter.format_type = MIME
        formatters[MIME] = formatter
    for module, name in _TYPES:
        formatters[MIME].for_type_by_name(module, name, _format)
    for module, name in _TEXT_TYPES:
        formatters["text/plain"].for_type_by_name(module, name, _export_text)
    return True


def _export_text(x: Any, p: Any, cycle: bool) -> None:
    # Deferred: as above, only exports need it.
    from .export_info import one_line

    try:
        p.text(one_line(_export_summary(x)))
    except Exception:  # noqa: BLE001 - fall back to the plain repr rather than fail printing
        p.text(repr(x)[:200])


def show(x: Any) -> None:
    """Show the view of a mesh, a sharding, a jax.Array or an export, once, in the notebook.

    Call it inside a ``%%multihost`` cell (on every process, as usual); the kernel shows
    the view built from process 0's summary.

    Examples
    --------
    ::

        %%multihost
        import jaxsys_kernel
        jaxsys_kernel.show(x.sharding)
    """
    summary = summarize(x)
    if summary is None:
        raise TypeError(
            f"no view for {type(x).__name__}; pass a Mesh, a NamedSharding, a jax.Array, "
            "a jax.export.Exported or a jaxsys_kernel.data plan"
        )
    display({MIME: summary, "text/plain": f"<{summary['kind']} view>"}, raw=True)
