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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..telemetry.schema import SCHEMA_VERSION

#: Holders kept per block once blocks are merged; the rest is counted in ``n_holders``.
MAX_HOLDERS = 8


# ---------------------------------------------------------------------------- meshes


def _flatten(devices: Any) -> list:
    """Devices of a mesh in row-major order, from an ndarray or nested lists."""
    if hasattr(devices, "flat"):
        return list(devices.flat)
    if isinstance(devices, list | tuple):
        out: list = []
        for d in devices:
            out.extend(_flatten(d))
        return out
    return [devices]


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
    devs = _flatten(mesh.devices)
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
    text = str(spec) if not isinstance(spec, tuple) else _format_spec(spec)
    return entries, text


def _format_spec(spec: Sequence[Any]) -> str:
    parts = [repr(tuple(e)) if isinstance(e, list | tuple) else repr(e) for e in spec]
    # Same text as PartitionSpec: a one-entry spec keeps its tuple comma, "P('x',)".
    return f"P({', '.join(parts)}{',' if len(parts) == 1 else ''})"


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
    dev_col, proc_col, key_col, replica_col = [], [], [], []
    for dev, proc, rng in entries:
        holders = groups.setdefault(rng, [])
        # Replica id: how many devices already hold these exact ranges, in device order.
        replica_col.append(len(holders))
        holders.append([dev, proc])
        dev_col.append(dev)
        proc_col.append(proc)
        key_col.append(rng)

    edges = [sorted({b for rng in groups for b in rng[d]}) for d in range(ndim)]
    # A zero-length dim has one boundary; give it one empty cell so the grid is never empty.
    edges = [e if len(e) > 1 else (e * 2 if e else [0, shape[d]]) for d, e in enumerate(edges)]
    tiles = [max(len(e) - 1, 1) for e in edges]

    def cell_of(rng: tuple) -> tuple[int, ...]:
        return tuple(bisect.bisect_left(edges[d], rng[d][0]) for d in range(ndim))

    first = next(iter(groups), tuple((0, n) for n in shape))
    common = {
        "num_devices": len(dev_col),
        "processes": sorted(set(proc_col)),
        "shard_shape": [b - a for a, b in first],
        "replicas": max((len(h) for h in groups.values()), default=0),
        "num_blocks": len(groups),
        "tiles": tiles,
    }

    if len(groups) <= max_blocks:
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
            **common,
            "edges": edges,
            "grid": [len(e) - 1 for e in edges],
            "aggregated": False,
            "factor": [1] * ndim,
            "blocks": blocks,
            "shards": {
                "device": dev_col,
                "process": proc_col,
                "block": [number[k] for k in key_col],
                "replica": replica_col,
            },
        }

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
        for d in range(ndim):
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
        **common,
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


# ---------------------------------------------------------------------------- simulation


@dataclass(frozen=True)
class FakeDevice:
    """A stand-in for a JAX device: only the attributes the summaries read.

    Attributes
    ----------
    id : int
        Global device id.
    process_index : int
        The JAX process that owns the device.
    coords : tuple of int, optional
        Physical coordinates, as TPU devices have.
    slice_index : int, optional
        The slice of a multi-slice (hybrid) system.
    """

    id: int
    process_index: int
    coords: tuple[int, ...] | None = None
    slice_index: int | None = None
    platform: str = "fake"
    device_kind: str = "simulated"


def fake_devices(
    n_devices: int,
    devices_per_process: int = 1,
    *,
    devices_per_slice: int | None = None,
    coords_shape: Sequence[int] | None = None,
) -> list[FakeDevice]:
    """Simulated devices, numbered like JAX does: process ``i`` owns a contiguous id range.

    Parameters
    ----------
    n_devices : int
        How many devices.
    devices_per_process : int, optional
        Devices per process: device ``d`` belongs to process ``d // devices_per_process``.
    devices_per_slice : int, optional
        If given, device ``d`` gets ``slice_index = d // devices_per_slice``.
    coords_shape : sequence of int, optional
        If given, device ``d`` gets the coordinates of ``d`` unravelled in this shape
        (row-major within its slice).

    Returns
    -------
    list of FakeDevice
    """
    if n_devices < 0 or devices_per_process < 1:
        raise ValueError("need n_devices >= 0 and devices_per_process >= 1")
    out = []
    for d in range(n_devices):
        local = d % devices_per_slice if devices_per_slice else d
        coords = None
        if coords_shape is not None:
            rest, c = local, []
            for size in reversed(coords_shape):
                rest, r = divmod(rest, size)
                c.append(r)
            coords = tuple(reversed(c))
        out.append(
            FakeDevice(
                id=d,
                process_index=d // devices_per_process,
                coords=coords,
                slice_index=d // devices_per_slice if devices_per_slice else None,
            )
        )
    return out


@dataclass(frozen=True)
class FakeMesh:
    """A stand-in for ``jax.sharding.Mesh`` with the attributes the summaries read.

    Attributes
    ----------
    devices : list
        Device descriptors, nested ``len(axis_names)`` deep.
    axis_names : tuple of str
        One name per mesh axis.
    """

    devices: list
    axis_names: tuple[str, ...]

    @property
    def shape(self) -> dict[str, int]:
        """Axis name to size, like ``Mesh.shape``."""
        sizes, level = [], self.devices
        for _ in self.axis_names:
            sizes.append(len(level))
            level = level[0] if level else []
        return dict(zip(self.axis_names, sizes, strict=True))


def fake_mesh(devices: Sequence[Any], mesh_shape: Sequence[int], axis_names: Sequence[str]):
    """Arrange devices (in order) into a :class:`FakeMesh` of the given shape.

    Parameters
    ----------
    devices : sequence
        Device descriptors, e.g. from :func:`fake_devices`; exactly ``prod(mesh_shape)``.
    mesh_shape : sequence of int
        Size of each mesh axis.
    axis_names : sequence of str
        Name of each mesh axis.
    """
    mesh_shape = [int(s) for s in mesh_shape]
    if len(mesh_shape) != len(axis_names):
        raise ValueError(f"{len(mesh_shape)} axis sizes but {len(axis_names)} axis names")
    if len(devices) != math.prod(mesh_shape):
        raise ValueError(f"mesh shape {mesh_shape} needs {math.prod(mesh_shape)} devices")

    def nest(flat: list, sizes: list[int]) -> list:
        if len(sizes) <= 1:
            return list(flat)
        step = math.prod(sizes[1:])
        return [nest(flat[i : i + step], sizes[1:]) for i in range(0, len(flat), step)]

    return FakeMesh(nest(list(devices), mesh_shape), tuple(str(a) for a in axis_names))


def _spec_axes(entry: Any) -> list[str]:
    if entry is None:
        return []
    if isinstance(entry, str):
        return [entry]
    return [str(a) for a in entry]


def block_layout(
    shape: Sequence[int],
    spec_axes: Sequence[Any],
    mesh_shape: Sequence[int],
    mesh_axis_names: Sequence[str],
    device_ids: Sequence[int],
    process_of: Callable[[int], int] | Mapping[int, int] | Sequence[int],
) -> list[dict]:
    """Compute, without JAX, the shards a ``NamedSharding`` gives each device.

    Each array dim named by the spec is split evenly over the product of its mesh axes (the
    first axis of a tuple varies slowest); mesh axes the spec does not use replicate.

    Parameters
    ----------
    shape : sequence of int
        Global array shape.
    spec_axes : sequence
        PartitionSpec entries: ``None``, an axis name, or a tuple of axis names; missing
        trailing entries mean ``None``.
    mesh_shape, mesh_axis_names : sequence
        The mesh's axis sizes and names.
    device_ids : sequence of int
        Device ids in mesh order (row-major).
    process_of : callable, mapping or sequence
        Device id to process index.

    Returns
    -------
    list of dict
        In mesh order: ``{"device": id, "process": p, "index": [[start, stop], ...]}``.

    Raises
    ------
    ValueError
        For an unknown or repeated mesh axis, a spec longer than the shape, or a dim that
        does not divide evenly.
    """
    shape = [int(n) for n in shape]
    names = [str(a) for a in mesh_axis_names]
    sizes = dict(zip(names, (int(s) for s in mesh_shape), strict=True))
    if len(spec_axes) > len(shape):
        raise ValueError(f"spec has {len(spec_axes)} entries for a {len(shape)}-d array")
    per_dim = [_spec_axes(e) for e in spec_axes] + [[]] * (len(shape) - len(spec_axes))
    used = [a for axes in per_dim for a in axes]
    for a in used:
        if a not in sizes:
            raise ValueError(f"mesh has no axis {a!r} (axes: {names})")
    if len(set(used)) != len(used):
        raise ValueError(f"a mesh axis is used twice in the spec {list(spec_axes)}")
    chunks = []
    for dim, axes in enumerate(per_dim):
        parts = math.prod(sizes[a] for a in axes)
        if shape[dim] % parts:
            raise ValueError(
                f"dim {dim} of size {shape[dim]} does not split evenly into {parts} parts"
            )
        chunks.append(shape[dim] // parts)
    if len(device_ids) != math.prod(sizes.values()):
        raise ValueError(f"mesh shape {list(mesh_shape)} needs {math.prod(sizes.values())} ids")
    lookup = process_of if callable(process_of) else process_of.__getitem__

    out = []
    for flat, dev in enumerate(device_ids):
        # Mesh coordinate of this position, row-major.
        coord, rest = {}, flat
        for name in reversed(names):
            rest, coord[name] = divmod(rest, sizes[name])
        index = []
        for dim, axes in enumerate(per_dim):
            tile = 0
            for a in axes:
                tile = tile * sizes[a] + coord[a]
            index.append([tile * chunks[dim], (tile + 1) * chunks[dim]])
        out.append({"device": int(dev), "process": int(lookup(int(dev))), "index": index})
    return out


class FakeNamedSharding:
    """A stand-in for ``NamedSharding`` over a :class:`FakeMesh`, built on :func:`block_layout`.

    Parameters
    ----------
    mesh : FakeMesh
        The device mesh.
    spec : sequence
        PartitionSpec entries (``None``, an axis name or a tuple of names).
    """

    def __init__(self, mesh: FakeMesh, spec: Iterable[Any]):
        self.mesh = mesh
        self.spec = tuple(spec)

    def devices_indices_map(self, shape: Sequence[int]) -> dict[Any, tuple[slice, ...]]:
        """Device to its index (a tuple of slices), in mesh order, like JAX's method."""
        devs = _flatten(self.mesh.devices)
        by_id = {d.id: d for d in devs}
        layout = block_layout(
            shape,
            self.spec,
            list(self.mesh.shape.values()),
            self.mesh.axis_names,
            [d.id for d in devs],
            lambda i: by_id[i].process_index,
        )
        return {by_id[e["device"]]: tuple(slice(a, b) for a, b in e["index"]) for e in layout}

    def __repr__(self) -> str:
        return f"FakeNamedSharding({_format_spec(self.spec)})"
