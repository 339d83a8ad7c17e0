"""What an exported computation is, as a plain dict: the facts its artifact card shows.

Built inside a JAX process from a ``jax.export.Exported`` (or a
:class:`jaxsys_kernel.export.LoadedExport`), drawn by
:class:`jaxsys_kernel.widgets.artifact.ArtifactView`, whose text form carries the same facts.

Shape (``kind == "export"``)::

    {"v": 1, "kind": "export", "fun_name": "predict",
     "inputs":  [{"name": "args[0]", "type": "f32[b, 4]", "sharding": "P('x', None)"}, ...],
     "outputs": [{"name": "result", "type": "f32[b, 3]", "sharding": None}, ...],
     "symbols": ["b"], "constraints": ["b >= 1", "b <= 64"],
     "nr_devices": 4, "mesh": "x=4" | None, "devices_here": 4,
     "platforms": ["cpu"], "platform_here": "cpu",
     "calling_convention": 10, "accepted": [9, 10],
     "loads_here": True, "runs_here": True, "why_not": "",
     "serialized_bytes": 2836, "disabled_checks": [], "effects": [], "has_vjp": False,
     "jax": "0.12.0.1", "jaxlib": "0.12.0.1", "path": None}

It imports JAX: it runs where JAX runs (``jaxsys_kernel.export`` and the display formatter,
which loads it on the first export it shows).
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jaxlib
from jax import export

from ..telemetry.schema import SCHEMA_VERSION
from .meshutil import format_spec

# The dtype names of the card, as JAX's own short forms read in HLO and in error messages.
_SHORT = {
    "float64": "f64",
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint64": "u64",
    "uint32": "u32",
    "uint16": "u16",
    "uint8": "u8",
    "bool": "bool",
    "complex64": "c64",
    "complex128": "c128",
}

# An explicit constraint, as the exporter writes it into the shape assertions of the module.
_CONSTRAINT = re.compile(r"symbolic shape constraint (.+?)\. Expected")


def short_dtype(dtype: Any) -> str:
    """``float32`` -> ``f32``; unknown names pass through."""
    name = str(getattr(dtype, "name", dtype))
    return _SHORT.get(name, name)


def aval_text(aval: Any) -> str:
    """An abstract value as the card writes it: ``f32[b, 4]`` (symbols as exported)."""
    return f"{short_dtype(aval.dtype)}[{', '.join(str(d) for d in aval.shape)}]"


def symbols_of(avals: Any) -> list[str]:
    """The dimension variables used in some abstract values, in order of appearance."""
    seen: dict[str, None] = {}
    for aval in avals:
        for d in aval.shape:
            get_vars = getattr(d, "get_vars", None)
            if get_vars is not None:
                for name in sorted(get_vars()):
                    seen.setdefault(str(name), None)
    return list(seen)


def _sharding_text(sharding: Any) -> str | None:
    if sharding is None:
        return None
    spec = getattr(sharding, "spec", None)
    if spec is not None:
        return format_spec(list(spec))
    return str(sharding)


def _mesh_text(shardings: Any) -> str | None:
    for s in shardings:
        mesh = getattr(s, "mesh", None)
        if mesh is not None and getattr(mesh, "axis_names", None):
            sizes = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))
            return ", ".join(f"{k}={v}" for k, v in sizes.items())
    return None


def _named_shardings(exp: Any, side: str) -> tuple:
    """The exported shardings by side (``in``/``out``), named where JAX kept the mesh.

    JAX 0.12 keeps them (over an abstract mesh) in a private field of ``Exported``; the
    public ``in_shardings_jax`` needs a concrete mesh of the right size, which the card
    cannot assume. Without the field the HLO shardings are shown as they print.
    """
    named = getattr(exp, f"_{side}_named_shardings", None)
    if named is not None:
        return tuple(named)
    return tuple(getattr(exp, f"{side}_shardings_hlo", ()) or ())


def leaf_names(tree: Any, n: int, root: str) -> list[str]:
    """Names of the flat leaves of an exported pytree: ``args[0]``, ``kwargs['w']``."""
    try:
        leaves = jax.tree_util.tree_unflatten(tree, list(range(n)))
        paths = jax.tree_util.tree_flatten_with_path(leaves)[0]
    except (ValueError, TypeError):
        return [f"{root}[{i}]" for i in range(n)]
    out = []
    for path, _ in paths:
        text = jax.tree_util.keystr(path)
        if root == "args":
            # in_tree is ((args...), {kwargs...}): name the halves as a caller writes them.
            text = re.sub(r"^\[0\]", "args", text)
            text = re.sub(r"^\[1\]", "kwargs", text)
        else:
            text = "result" + text if text else "result"
        out.append(text)
    return out


def mesh_of(exp: Any) -> str | None:
    """The mesh an export's shardings name, as ``x=4, y=2`` (None without one)."""
    return _mesh_text(_named_shardings(exp, "in") + _named_shardings(exp, "out"))


def constraints_of(exp: Any, symbols: list[str]) -> list[str]:
    """Implicit (``b >= 1``) and explicit constraints on the dimension variables.

    Explicit ones live in the symbolic scope while the export is fresh; a deserialized
    export keeps them only in its shape assertions, where they are read back from.
    """
    found = [f"{s} >= 1" for s in symbols]
    if not symbols:
        return found
    explicit: list[str] = []
    for aval in exp.in_avals:
        for d in aval.shape:
            scope = getattr(d, "scope", None)
            # Private in 0.12: the scope's own list of explicit constraints.
            for c in getattr(scope, "_explicit_constraints", ()) or ():
                explicit.append(str(c).removeprefix("Constraint(").removesuffix(")"))
    if not explicit:
        try:
            text = exp.mlir_module()
        except Exception:  # noqa: BLE001 - the card shows what it can read
            text = ""
        explicit = _CONSTRAINT.findall(text)
    for c in explicit:
        if c not in found:
            found.append(c)
    return found


def _compat(exp: Any) -> dict:
    lo = export.minimum_supported_calling_convention_version
    hi = export.maximum_supported_calling_convention_version
    version = int(exp.calling_convention_version)
    here = export.default_export_platform()
    disabled = [str(c) for c in exp.disabled_safety_checks]
    platforms = [str(p) for p in exp.platforms]
    loads = lo <= version <= hi
    why = []
    if not loads:
        why.append(f"calling convention {version} is outside {lo}-{hi}, what this jaxlib accepts")
    runs_platform = here in platforms or "platform" in disabled
    if not runs_platform:
        why.append(f"exported for {', '.join(platforms)}; this process is {here}")
    devices = jax.device_count()
    if exp.nr_devices > devices:
        why.append(f"needs {exp.nr_devices} devices; this world has {devices}")
    return {
        "calling_convention": version,
        "accepted": [lo, hi],
        "loads_here": loads,
        "runs_here": loads and runs_platform and exp.nr_devices <= devices,
        "why_not": "; ".join(why),
        "platforms": platforms,
        "platform_here": here,
        "devices_here": devices,
        "disabled_checks": disabled,
    }


def export_info(obj: Any, serialized_bytes: int | None = None, path: str | None = None) -> dict:
    """The artifact card's facts about an exported computation.

    Parameters
    ----------
    obj : jax.export.Exported or LoadedExport
        The export (a loaded one brings its file's path and size).
    serialized_bytes : int, optional
        The size of its serialized form; measured by serializing when not given.
    path : str, optional
        The file it was loaded from or saved to.

    Returns
    -------
    dict
        The ``export`` summary described in this module's docstring.
    """
    exp = getattr(obj, "exported", obj)
    path = path or getattr(obj, "path", None)
    if serialized_bytes is None:
        serialized_bytes = getattr(obj, "serialized_bytes", None)
    if serialized_bytes is None:
        serialized_bytes = len(exp.serialize())
    in_sh = _named_shardings(exp, "in")
    out_sh = _named_shardings(exp, "out")
    in_names = leaf_names(exp.in_tree, len(exp.in_avals), "args")
    out_names = leaf_names(exp.out_tree, len(exp.out_avals), "result")
    symbols = symbols_of(exp.in_avals)

    def side(names, avals, shardings):
        padded = list(shardings) + [None] * (len(avals) - len(shardings))
        return [
            {"name": n, "type": aval_text(a), "sharding": _sharding_text(s)}
            for n, a, s in zip(names, avals, padded, strict=False)
        ]

    effects = [str(e) for e in (*exp.ordered_effects, *exp.unordered_effects)]
    return {
        "v": SCHEMA_VERSION,
        "kind": "export",
        "fun_name": exp.fun_name,
        "inputs": side(in_names, exp.in_avals, in_sh),
        "outputs": side(out_names, exp.out_avals, out_sh),
        "symbols": symbols,
        "constraints": constraints_of(exp, symbols),
        "nr_devices": int(exp.nr_devices),
        "mesh": _mesh_text(in_sh + out_sh),
        "serialized_bytes": int(serialized_bytes),
        "effects": effects,
        "has_vjp": bool(exp.has_vjp()),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "path": path,
        **_compat(exp),
    }


def one_line(info: dict) -> str:
    """The export in one line, for a cell's plain-text result."""
    ins = ", ".join(i["type"] for i in info["inputs"])
    outs = ", ".join(o["type"] for o in info["outputs"])
    return (
        f"<Exported {info['fun_name']}({ins}) -> {outs}; {', '.join(info['platforms'])}, "
        f"{info['nr_devices']} device(s), {info['serialized_bytes']} bytes>"
    )
