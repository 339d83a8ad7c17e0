"""Simulated devices, meshes and shardings: what the summaries read, without JAX.

Tests and benchmarks use them to summarise meshes of thousands of devices without
hardware; :func:`block_layout` computes a ``NamedSharding``'s shards the way JAX does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .meshutil import flatten, format_spec


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
    per_dim, chunks = _split_dims(shape, spec_axes, sizes, names)
    if len(device_ids) != math.prod(sizes.values()):
        raise ValueError(f"mesh shape {list(mesh_shape)} needs {math.prod(sizes.values())} ids")
    lookup = process_of if callable(process_of) else process_of.__getitem__
    return [
        {
            "device": int(dev),
            "process": int(lookup(int(dev))),
            "index": _block_index(flat, names, sizes, per_dim, chunks),
        }
        for flat, dev in enumerate(device_ids)
    ]


def _split_dims(
    shape: list[int], spec_axes: Sequence[Any], sizes: dict[str, int], names: list[str]
) -> tuple[list[list[str]], list[int]]:
    """The mesh axes of each array dim, and each dim's block length, checked."""
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
    return per_dim, chunks


def _block_index(
    flat: int, names: list[str], sizes: dict[str, int], per_dim: list[list[str]], chunks: list[int]
) -> list[list[int]]:
    """``[[start, stop], ...]`` of the block at row-major mesh position ``flat``."""
    coord, rest = {}, flat
    for name in reversed(names):
        rest, coord[name] = divmod(rest, sizes[name])
    index = []
    for dim, axes in enumerate(per_dim):
        tile = 0
        for a in axes:
            tile = tile * sizes[a] + coord[a]
        index.append([tile * chunks[dim], (tile + 1) * chunks[dim]])
    return index


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
        devs = flatten(self.mesh.devices)
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
        return f"FakeNamedSharding({format_spec(self.spec)})"
