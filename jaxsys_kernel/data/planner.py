"""Which slices of a global batch each process reads, computed from the sharding alone.

A sharding says which index of the global array every device holds
(``devices_indices_map``), for all processes at once. :func:`plan` turns that into reads:
for each process, the distinct boxes its devices need, merged into as few rectangular
slices as the layout allows, with the devices each slice feeds and the other processes that
read the same elements (replicas). Nothing here imports JAX or touches array data, so the
kernel can draw a plan and tests can plan for simulated devices
(:mod:`jaxsys_kernel.engine.simulate`).

Three strategies match the ways a multi-process program can load a batch:

``"process"``
    One reader per process: each distinct box its devices need, merged. Replicas held by
    several devices of a process are read once.
``"device"``
    One reader per device: every device reads its own box, so a box held by two devices of
    a process is read twice.
``"all"``
    Every process reads the whole batch and keeps what its devices need.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.meshutil import format_spec
from ..telemetry.schema import SCHEMA_VERSION
from .boxes import Box, Range, box_of, box_size, contains, merge_boxes, runs_of
from .draw import plan_svg, plan_text

__all__ = [
    "STRATEGIES",
    "Block",
    "Box",
    "DataPlan",
    "ProcessReads",
    "Range",
    "Read",
    "box_of",
    "box_size",
    "contains",
    "merge_boxes",
    "plan",
    "runs_of",
]

STRATEGIES = ("process", "device", "all")


@dataclass(frozen=True)
class Read:
    """One rectangular slice of the global batch that a process reads.

    Attributes
    ----------
    index : tuple of (int, int)
        ``[start, stop)`` per dim.
    nbytes : int
        Bytes in the slice.
    runs : int
        Contiguous byte runs the slice is made of in a C-ordered source (1 for whole rows).
    devices : tuple of int
        Ids of this process's devices whose shards come out of this slice.
    shared_with : tuple of int
        Other processes that read some of the same elements: replicas across processes.
    """

    index: Box
    nbytes: int
    runs: int
    devices: tuple[int, ...]
    shared_with: tuple[int, ...] = ()

    def slices(self, offset: int = 0) -> tuple[slice, ...]:
        """The read as a tuple of slices; ``offset`` shifts dim 0 (the batch's first row)."""
        first = (slice(self.index[0][0] + offset, self.index[0][1] + offset),)
        return first + tuple(slice(a, b) for a, b in self.index[1:])


@dataclass(frozen=True)
class ProcessReads:
    """What one process reads, and where each of its devices' shards comes from.

    Attributes
    ----------
    process : int
        The process index.
    devices : tuple of (int, Box)
        Each device of the process (id) with its box of the global batch, in the
        sharding's device order.
    reads : tuple of Read
        The slices the process reads.
    """

    process: int
    devices: tuple[tuple[int, Box], ...]
    reads: tuple[Read, ...]

    @property
    def nbytes(self) -> int:
        """Bytes read by this process."""
        return sum(r.nbytes for r in self.reads)

    @property
    def runs(self) -> int:
        """Contiguous byte runs over all reads."""
        return sum(r.runs for r in self.reads)

    @property
    def rows(self) -> tuple[Range, ...]:
        """The distinct dim-0 ranges its devices need, merged and sorted."""
        ranges = sorted({box[0] for _, box in self.devices})
        out: list[Range] = []
        for a, b in ranges:
            if out and a <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], b))
            else:
                out.append((a, b))
        return tuple(out)

    def read_for(self, device: int) -> tuple[int, tuple[slice, ...]]:
        """Which read holds ``device``'s shard, and where inside that read it lies.

        Raises
        ------
        KeyError
            If the device does not belong to this process.
        """
        box = dict(self.devices)[device]
        for k, r in enumerate(self.reads):
            if device in r.devices and contains(r.index, box):
                inner = tuple(
                    slice(a - ra, b - ra) for (a, b), (ra, _) in zip(box, r.index, strict=True)
                )
                return k, inner
        raise KeyError(f"no read of process {self.process} holds device {device}")


@dataclass(frozen=True)
class Block:
    """A distinct box of the global batch and the devices (and processes) that hold it."""

    index: Box
    holders: tuple[tuple[int, int], ...]

    @property
    def processes(self) -> tuple[int, ...]:
        """Processes holding the box."""
        return tuple(sorted({p for _, p in self.holders}))


@dataclass(frozen=True)
class DataPlan:
    """Which slices of a global batch every process reads, for one sharding.

    Built by :func:`plan`. Its text form is a table (one row per process); in a jaxsys
    notebook ``jaxsys_kernel.show(plan)`` draws it.

    Attributes
    ----------
    shape : tuple of int
        The global batch's shape.
    dtype : str
        Element type; ``itemsize`` bytes each.
    strategy : str
        ``"process"``, ``"device"`` or ``"all"`` (see the module docstring).
    blocks : tuple of Block
        The distinct device boxes, in grid order.
    processes : tuple of ProcessReads
        One entry per process, by process index.
    sharding : str
        The sharding's text form (its spec for a named sharding).
    mesh : dict or None
        ``{"axis_names": [...], "shape": [...]}`` of a named sharding's mesh.
    """

    shape: tuple[int, ...]
    dtype: str
    itemsize: int
    strategy: str
    blocks: tuple[Block, ...]
    processes: tuple[ProcessReads, ...]
    sharding: str = ""
    mesh: dict | None = None

    @property
    def nbytes(self) -> int:
        """Bytes in the global batch."""
        return math.prod(self.shape) * self.itemsize

    @property
    def total_read(self) -> int:
        """Bytes read by all processes together."""
        return sum(p.nbytes for p in self.processes)

    @property
    def amplification(self) -> float:
        """Bytes read over bytes in the batch: 1.0 when every element is read once."""
        return self.total_read / self.nbytes if self.nbytes else 0.0

    @property
    def replicas(self) -> int:
        """The most devices holding one box."""
        return max((len(b.holders) for b in self.blocks), default=0)

    def for_process(self, process: int) -> ProcessReads:
        """The reads of one process.

        Raises
        ------
        ValueError
            If the sharding has no device on that process.
        """
        for p in self.processes:
            if p.process == process:
                return p
        have = ", ".join(str(p.process) for p in self.processes)
        raise ValueError(f"process {process} holds no device of this sharding (processes {have})")

    def data_groups(self) -> list[tuple[tuple[Range, ...], tuple[int, ...]]]:
        """Processes that need the same rows, grouped: ``[(rows, processes), ...]``.

        With pure data parallelism each process is a group of its own; when a model replica
        spans processes, the processes holding it need the same rows and must load the same
        records. Groups are sorted by their first row.
        """
        groups: dict[tuple[Range, ...], list[int]] = {}
        for p in self.processes:
            groups.setdefault(p.rows, []).append(p.process)
        return sorted((rows, tuple(ps)) for rows, ps in groups.items())

    def summary(self) -> dict:
        """The plan as a JSON-ready dict (kind ``"dataplan"``) for the views."""
        return {
            "v": SCHEMA_VERSION,
            "kind": "dataplan",
            "shape": list(self.shape),
            "dtype": self.dtype,
            "itemsize": self.itemsize,
            "nbytes": self.nbytes,
            "strategy": self.strategy,
            "sharding": self.sharding,
            "mesh": self.mesh,
            "edges": _edges(self.blocks, self.shape),
            "total_read": self.total_read,
            "blocks": [
                {
                    "index": [list(r) for r in b.index],
                    "holders": [list(h) for h in b.holders],
                    "readers": list(self._readers(b)),
                }
                for b in self.blocks
            ],
            "processes": [
                {
                    "process": p.process,
                    "devices": [d for d, _ in p.devices],
                    "nbytes": p.nbytes,
                    "runs": p.runs,
                    "reads": [
                        {
                            "index": [list(x) for x in r.index],
                            "nbytes": r.nbytes,
                            "runs": r.runs,
                            "devices": list(r.devices),
                            "shared_with": list(r.shared_with),
                        }
                        for r in p.reads
                    ],
                }
                for p in self.processes
            ],
        }

    def _readers(self, block: Block) -> tuple[int, ...]:
        if self.strategy == "all":
            return tuple(p.process for p in self.processes)
        return block.processes

    def svg(self) -> str:
        """The plan drawn as a self-contained SVG (in an HTML ``div``)."""
        return plan_svg(self.summary())

    def __str__(self) -> str:

        return plan_text(self.summary())

    def __repr__(self) -> str:
        return (
            f"DataPlan({self.dtype}{list(self.shape)}, {self.sharding or 'sharding'}, "
            f"strategy={self.strategy!r}, processes={len(self.processes)}, "
            f"reads {self.total_read} bytes of a {self.nbytes}-byte batch)"
        )


def _edges(blocks: Sequence[Block], shape: Sequence[int]) -> list[list[int]]:
    edges = []
    for d, n in enumerate(shape):
        e = sorted({x for b in blocks for x in b.index[d]} | {0, int(n)})
        edges.append(e)
    return edges


def _sharding_text(sharding: Any) -> tuple[str, dict | None]:
    spec = getattr(sharding, "spec", None)
    mesh = getattr(sharding, "mesh", None)
    mesh_info = None
    if mesh is not None and hasattr(mesh, "axis_names"):
        names = [str(n) for n in mesh.axis_names]
        mesh_info = {"axis_names": names, "shape": [int(mesh.shape[n]) for n in names]}
    if spec is None:
        return type(sharding).__name__, mesh_info
    if isinstance(spec, tuple) and type(spec) is tuple:
        return format_spec(spec), mesh_info
    return str(spec), mesh_info


def plan(
    global_shape: Sequence[int],
    sharding: Any,
    dtype: Any = "float32",
    *,
    strategy: str = "process",
) -> DataPlan:
    """Plan which slices of a global batch every process reads.

    Parameters
    ----------
    global_shape : sequence of int
        Shape of the global batch.
    sharding : jax.sharding.Sharding or FakeNamedSharding
        Anything with ``devices_indices_map(shape)`` whose devices have ``id`` and
        ``process_index``.
    dtype : numpy dtype or str, optional
        Element type, for byte counts.
    strategy : {"process", "device", "all"}, optional
        Who reads: one reader per process (merged slices, replicas read once), one per
        device, or every process everything.

    Returns
    -------
    DataPlan

    Raises
    ------
    ValueError
        For an unknown strategy, a negative dim, or a strided device index.

    Examples
    --------
    >>> from jaxsys_kernel.engine.simulate import FakeNamedSharding, fake_devices, fake_mesh
    >>> mesh = fake_mesh(fake_devices(8, 2), (8,), ("batch",))
    >>> p = plan((64, 128), FakeNamedSharding(mesh, ("batch",)))
    >>> [r.index for r in p.for_process(1).reads]
    [((16, 32), (0, 128))]
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    shape = tuple(int(n) for n in global_shape)
    if any(n < 0 for n in shape):
        raise ValueError(f"global_shape {list(shape)} has a negative dim")
    dt = np.dtype(dtype)
    by_proc: dict[int, list[tuple[int, Box]]] = {}
    holders: dict[Box, list[tuple[int, int]]] = {}
    for dev, index in sharding.devices_indices_map(shape).items():
        box = box_of(index, shape)
        proc = int(dev.process_index)
        by_proc.setdefault(proc, []).append((int(dev.id), box))
        holders.setdefault(box, []).append((int(dev.id), proc))
    blocks = tuple(Block(box, tuple(h)) for box, h in sorted(holders.items()))
    readers = {box: {p for _, p in h} for box, h in holders.items()}
    processes = tuple(
        ProcessReads(p, tuple(devs), _reads(devs, shape, dt.itemsize, strategy, readers, p))
        for p, devs in sorted(by_proc.items())
    )
    text, mesh = _sharding_text(sharding)
    return DataPlan(shape, dt.name, dt.itemsize, strategy, blocks, processes, text, mesh)


def _reads(
    devices: list[tuple[int, Box]],
    shape: tuple[int, ...],
    itemsize: int,
    strategy: str,
    readers: dict[Box, set[int]],
    process: int,
) -> tuple[Read, ...]:
    """The reads of one process under a strategy."""
    if strategy == "all":
        # Only here: over every block, for each process, it made a large plan quadratic.
        all_procs = sorted({p for ps in readers.values() for p in ps})
        whole = tuple((0, n) for n in shape)
        others = tuple(p for p in all_procs if p != process)
        ids = tuple(d for d, _ in devices)
        return (Read(whole, box_size(whole) * itemsize, runs_of(whole, shape), ids, others),)
    if strategy == "device":
        return tuple(
            Read(
                box,
                box_size(box) * itemsize,
                runs_of(box, shape),
                (dev,),
                tuple(sorted(readers[box] - {process})),
            )
            for dev, box in devices
        )
    out = []
    for box in merge_boxes((b for _, b in devices), shape):
        inside = [(d, b) for d, b in devices if contains(box, b)]
        shared = set().union(*(readers[b] for _, b in inside)) - {process}
        out.append(
            Read(
                box,
                box_size(box) * itemsize,
                runs_of(box, shape),
                tuple(d for d, _ in inside),
                tuple(sorted(shared)),
            )
        )
    return tuple(out)
