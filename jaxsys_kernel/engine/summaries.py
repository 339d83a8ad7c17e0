"""Mesh and sharding summaries, computed inside a JAX process and drawn by the widgets.

The kernel never holds a device or an array. It asks an engine for one of these plain dicts
(JSON-ready, versioned) and hands it to :mod:`jaxsys_kernel.widgets`. The code only reads
attributes, never array data, so it works for arrays that span processes, and it works on
duck-typed device descriptors (anything with ``id`` and ``process_index``, optionally
``coords`` and ``slice_index``). That lets tests and benchmarks summarise simulated meshes of
thousands of devices without hardware (:func:`fake_devices`, :func:`fake_mesh`,
:class:`FakeNamedSharding`).

Shapes
------
``MeshInfo`` (:func:`mesh_info`)::

    {"v": 1, "kind": "mesh",
     "axis_names": ["x", "y"], "shape": [4, 2],
     "devices": [0, 1, ...],          # ids in mesh order (row-major over shape)
     "process": [0, 0, ...],          # process index of each entry of "devices"
     "coords": [[0, 0, 0], ...] | None,   # per device, None when no device has coords
     "slice_index": [0, ...] | None,      # per device, None when no device has one
     "processes": [0, 1], "num_devices": 8,
     "platform": "cpu" | None, "device_kind": "cpu" | None}

``ShardingInfo`` (:func:`sharding_info`)::

    {"v": 1, "kind": "sharding",
     "shape": [8, 6], "dtype": "float32",
     "sharding": "NamedSharding",            # type name of the sharding
     "spec": ["x", None] | "<repr>",         # one entry per dim for a NamedSharding
     "spec_repr": "P('x', None)",
     "mesh": {"axis_names": [...], "shape": [...]} | None,
     "num_devices": 8, "processes": [0, 1],
     "shard_shape": [2, 6],                  # shape of one shard
     "replicas": 2,                          # copies of each distinct shard (max)
     "num_blocks": 4,                        # distinct shards before aggregation
     "tiles": [4, 1],                        # distinct ranges per dim before aggregation
     "edges": [[0, 2, 4, 6, 8], [0, 6]],     # block boundaries per dim (after aggregation)
     "grid": [4, 1],                         # len(edges[d]) - 1
     "aggregated": False, "factor": [1, 1],  # blocks merged per dim when aggregated
     "blocks": [Block, ...],                 # sorted by "cell", row-major
     "shards": {"device": [...], "process": [...], "block": [...], "replica": [...]} | None}

    Block = {"index": [[0, 2], [0, 6]],      # [start, stop) per dim
             "cell": [0, 0],                 # position in the grid given by "edges"
             "holders": [[0, 0], [1, 0]],    # [device, process], in replica-id order
             "n_holders": 2,                 # devices holding (part of) this block
             "replicas": 2,                  # copies of each shard inside the block
             "addressable_by": [0],          # processes holding it
             "merged": 1}                    # original blocks merged into this one

``shards`` lists every device once (columns aligned by position): the block it holds
(an index into ``blocks``) and its replica id, the position of the device among the devices
holding the same index ranges, in the sharding's device order. It is ``None`` when the
payload is aggregated; aggregated blocks keep at most :data:`MAX_HOLDERS` holders each.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import Any

from ..telemetry.schema import SCHEMA_VERSION
from .meshutil import flatten, format_spec

#: Holders kept per block once blocks are merged; the rest is counted in ``n_holders``.
MAX_HOLDERS = 8


# ---------------------------------------------------------------------------- meshes


def _opt_ints(value: Any) -> list[int] | None:
    return None if value is None else [int(v) for v in value]


def mesh_info(mesh: Any) -> dict:
    """Summarise a device mesh for :class:`~jaxsys_kernel.widgets.MeshView`.

    Parameters
    ----------
    mesh : jax.sharding.Mesh or FakeMesh
        Anything with ``axis_names``, a ``shape`` mapping axis name to size, and
        ``devices`` (an ndarray or nested lists of device descriptors).

    Returns
    -------
    dict
        A MeshInfo dict (see the module docstring).

    Raises
    ------
    ValueError
        If the number of devices does not match the mesh shape.
    """
    names = [str(n) for n in mesh.axis_names]
    sizes = [int(mesh.shape[n]) for n in names]
    devs = flatten(mesh.devices)
    if len(devs) != math.prod(sizes):
        raise ValueError(f"mesh shape {sizes} needs {math.prod(sizes)} devices, got {len(devs)}")
    coords = [_opt_ints(getattr(d, "coords", None)) for d in devs]
    slices = [getattr(d, "slice_index", None) for d in devs]
    procs = [int(d.process_index) for d in devs]
    first = devs[0] if devs else None
    return {
        "v": SCHEMA_VERSION,
        "kind": "mesh",
        "axis_names": names,
        "shape": sizes,
        "devices": [int(d.id) for d in devs],
        "process": procs,
        # A column of all-None says nothing; drop it so the view can test for presence.
        "coords": coords if any(c is not None for c in coords) else None,
        # One slice is no hybrid mesh (every CPU device reports slice 0): draw it plainly.
        "slice_index": (
            [None if s is None else int(s) for s in slices]
            if len({s for s in slices if s is not None}) > 1
            else None
        ),
        "processes": sorted(set(procs)),
        "num_devices": len(devs),
        "platform": getattr(first, "platform", None),
        "device_kind": getattr(first, "device_kind", None),
    }


# ---------------------------------------------------------------------------- shardings


def _ranges(index: Sequence[Any], shape: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """Turn a tuple of slices (as ``devices_indices_map`` gives) into ``(start, stop)`` pairs."""
    out = []
    for dim, (s, n) in enumerate(zip(index, shape, strict=True)):
        if isinstance(s, slice):
            start, stop, step = s.indices(n)
            if step != 1:
                raise ValueError(f"dim {dim}: strided shard index {s} is not supported")
        else:
            start, stop = int(s[0]), int(s[1])
        out.append((int(start), int(stop)))
    return tuple(out)


def _spec_entry(entry: Any) -> str | list[str] | None:
    if entry is None:
        return None
    if isinstance(entry, str):
        return entry
    if isinstance(entry, list | tuple):
        return [str(a) for a in entry]
    return str(entry)  # e.g. PartitionSpec.UNCONSTRAINED


def _spec_of(sharding: Any, ndim: int) -> tuple[list | str, str]:
    """The spec as JSON (one entry per dim) and as text."""
    spec = getattr(sharding, "spec", None)
    if spec is None or not hasattr(sharding, "mesh"):
        return repr(sharding), repr(sharding)
    entries = [_spec_entry(e) for e in spec]
    entries += [None] * (ndim - len(entries))
    # A real PartitionSpec prints as P(...); give plain tuples (FakeNamedSharding) the same look.
    text = str(spec) if not isinstance(spec, tuple) else format_spec(spec)
    return entries, text


def _mesh_of(sharding: Any) -> dict | None:
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or not hasattr(mesh, "axis_names"):
        return None
    names = [str(n) for n in mesh.axis_names]
    return {"axis_names": names, "shape": [int(mesh.shape[n]) for n in names]}


def _unpack(x: Any, dtype: Any) -> tuple[Any, tuple[int, ...], str | None]:
    if isinstance(x, tuple) and len(x) == 2 and hasattr(x[0], "devices_indices_map"):
        sharding, shape = x
    elif hasattr(x, "sharding") and hasattr(x, "shape"):
        # A jax.Array or a ShapeDtypeStruct: only metadata is read, never the data.
        sharding, shape = x.sharding, x.shape
        dtype = dtype if dtype is not None else getattr(x, "dtype", None)
    else:
        raise TypeError(
            f"sharding_info needs a jax.Array or a (sharding, shape) pair, "
            f"got {type(x).__qualname__}"
        )
    return sharding, tuple(int(n) for n in shape), None if dtype is None else str(dtype)


def sharding_info(x: Any, *, max_blocks: int = 4096, dtype: Any = None) -> dict:
    """Summarise how an array is laid out over devices and processes.

    Only ``sharding.devices_indices_map(shape)`` is consulted, which covers every device
    (addressable or not), so this is safe on arrays spanning processes and never moves data.

    Parameters
    ----------
    x : jax.Array or tuple
        An array (its ``shape``, ``dtype`` and ``sharding`` are read) or a
        ``(sharding, shape)`` pair; the sharding may be a :class:`FakeNamedSharding`.
    max_blocks : int, optional
        Most blocks in the payload. With more distinct shards, neighbouring blocks are
        merged along the grid (``"aggregated": True``, ``"factor"`` per dim).
    dtype : optional
        The dtype to report for a ``(sharding, shape)`` pair.

    Returns
    -------
    dict
        A ShardingInfo dict (see the module docstring); its size is O(devices) at most;
        once aggregated, at most max_blocks blocks of at most MAX_HOLDERS holders each.
    """
    sharding, shape, dt = _unpack(x, dtype)
    entries = [
        (int(dev.id), int(dev.process_index), _ranges(idx, shape))
        for dev, idx in sharding.devices_indices_map(shape).items()
    ]
    spec, spec_repr = _spec_of(sharding, len(shape))
    info = _summarise(shape, entries, max_blocks=max(1, int(max_blocks)))
    return {
        "v": SCHEMA_VERSION,
        "kind": "sharding",
        "shape": list(shape),
        "dtype": dt,
        "sharding": type(sharding).__name__,
        "spec": spec,
        "spec_repr": spec_repr,
        "mesh": _mesh_of(sharding),
        **info,
    }


def _summarise(
    shape: tuple[int, ...],
    entries: list[tuple[int, int, tuple[tuple[int, int], ...]]],
    *,
    max_blocks: int,
) -> dict:
    """Group ``(device, process, ranges)`` entries into blocks, merging them if too many."""
    ndim = len(shape)
    groups: dict[tuple, list[list[int]]] = {}
    columns: dict[str, list] = {"device": [], "process": [], "key": [], "replica": []}
    for dev, proc, rng in entries:
        holders = groups.setdefault(rng, [])
        # Replica id: how many devices already hold these exact ranges, in device order.
        columns["replica"].append(len(holders))
        holders.append([dev, proc])
        columns["device"].append(dev)
        columns["process"].append(proc)
        columns["key"].append(rng)

    edges = [sorted({b for rng in groups for b in rng[d]}) for d in range(ndim)]
    # A zero-length dim has one boundary; give it one empty cell so the grid is never empty.
    edges = [e if len(e) > 1 else (e * 2 if e else [0, shape[d]]) for d, e in enumerate(edges)]
    tiles = [max(len(e) - 1, 1) for e in edges]

    def cell_of(rng: tuple) -> tuple[int, ...]:
        return tuple(bisect.bisect_left(edges[d], rng[d][0]) for d in range(ndim))

    first = next(iter(groups), tuple((0, n) for n in shape))
    common = {
        "num_devices": len(columns["device"]),
        "processes": sorted(set(columns["process"])),
        "shard_shape": [b - a for a, b in first],
        "replicas": max((len(h) for h in groups.values()), default=0),
        "num_blocks": len(groups),
        "tiles": tiles,
    }
    if len(groups) <= max_blocks:
        return {**common, **_exact_blocks(groups, columns, edges, cell_of)}
    return {**common, **_merged_blocks(groups, edges, tiles, cell_of, max_blocks)}


def _exact_blocks(groups: dict, columns: dict, edges: list, cell_of: Callable) -> dict:
    """One block per distinct shard, and every device in ``shards``."""
    order = sorted(groups, key=cell_of)
    number = {rng: i for i, rng in enumerate(order)}
    blocks = [
        {
            "index": [list(r) for r in rng],
            "cell": list(cell_of(rng)),
            "holders": groups[rng],
            "n_holders": len(groups[rng]),
            "replicas": len(groups[rng]),
            "addressable_by": sorted({p for _, p in groups[rng]}),
            "merged": 1,
        }
        for rng in order
    ]
    return {
        "edges": edges,
        "grid": [len(e) - 1 for e in edges],
        "aggregated": False,
        "factor": [1] * len(edges),
        "blocks": blocks,
        "shards": {
            "device": columns["device"],
            "process": columns["process"],
            "block": [number[k] for k in columns["key"]],
            "replica": columns["replica"],
        },
    }


def _merged_blocks(
    groups: dict, edges: list, tiles: list[int], cell_of: Callable, max_blocks: int
) -> dict:
    """Neighbouring shards merged along the grid until at most ``max_blocks`` remain."""
    factor = _merge_factors(tiles, max_blocks)
    merged: dict[tuple[int, ...], dict] = {}
    for rng, holders in groups.items():
        cell = tuple(c // f for c, f in zip(cell_of(rng), factor, strict=True))
        m = merged.get(cell)
        if m is None:
            merged[cell] = {
                "index": [list(r) for r in rng],
                "cell": list(cell),
                "holders": holders[:MAX_HOLDERS],
                "n_holders": len(holders),
                "replicas": len(holders),
                "addressable_by": {p for _, p in holders},
                "merged": 1,
            }
            continue
        for d in range(len(edges)):
            m["index"][d][0] = min(m["index"][d][0], rng[d][0])
            m["index"][d][1] = max(m["index"][d][1], rng[d][1])
        room = MAX_HOLDERS - len(m["holders"])
        if room > 0:
            m["holders"] = m["holders"] + holders[:room]
        m["n_holders"] += len(holders)
        m["replicas"] = max(m["replicas"], len(holders))
        m["addressable_by"].update(p for _, p in holders)
        m["merged"] += 1
    blocks = [merged[c] for c in sorted(merged)]
    for b in blocks:
        b["addressable_by"] = sorted(b["addressable_by"])
    new_edges = [
        e[::f] if (len(e) - 1) % f == 0 else e[::f] + [e[-1]]
        for e, f in zip(edges, factor, strict=True)
    ]
    return {
        "edges": new_edges,
        "grid": [len(e) - 1 for e in new_edges],
        "aggregated": True,
        "factor": factor,
        "blocks": blocks,
        "shards": None,
    }


def _merge_factors(tiles: Sequence[int], max_blocks: int) -> list[int]:
    """Per-dim merge factors (powers of two) so that the merged grid has <= max_blocks cells.

    The dim with the most cells left is halved first, which keeps merged blocks close to
    square in grid units and so keeps the drawing's proportions.
    """
    factor = [1] * len(tiles)

    def cells() -> list[int]:
        return [-(-t // f) for t, f in zip(tiles, factor, strict=True)]

    while math.prod(cells()) > max_blocks:
        c = cells()
        d = max(range(len(c)), key=lambda i: c[i])
        factor[d] *= 2
    return factor


# The simulation lives in its own module; its names stay importable from here.
from .simulate import (  # noqa: E402
    FakeDevice,
    FakeMesh,
    FakeNamedSharding,
    block_layout,
    fake_devices,
    fake_mesh,
)

__all__ = [
    "MAX_HOLDERS",
    "FakeDevice",
    "FakeMesh",
    "FakeNamedSharding",
    "block_layout",
    "fake_devices",
    "fake_mesh",
    "mesh_info",
    "sharding_info",
]
