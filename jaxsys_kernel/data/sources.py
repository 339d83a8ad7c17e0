"""Where a global batch comes from: arrays, memory-mapped ``.npy`` files and Grain datasets.

An array source is the global batch itself, or a stack of batches along dim 0 (batch
``step`` is rows ``step * B`` to ``(step + 1) * B``); it is read one rectangular slice at a
time and never as a whole. A ``.npy`` path is opened with ``mmap_mode="r"``, so a slice
costs the pages it spans and nothing else.

A Grain source is a random-access sequence of records, one record per row of the batch.
Each process takes its own share of the records with Grain's sharding options
(``grain.sharding.ShardByJaxProcess`` for pure data parallelism), so processes never need
to agree on which records form a global batch: the per-replica batches are independent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from .planner import DataPlan, ProcessReads


def _is_grain(source: Any) -> bool:
    """A Grain ``MapDataset`` or a random-access data source (``__len__`` + ``__getitem__``)."""
    if isinstance(source, np.ndarray | str | os.PathLike):
        return False
    return hasattr(source, "__len__") and hasattr(source, "__getitem__")


@dataclass
class ArraySource:
    """An in-memory array or a memory map, read by slices.

    Attributes
    ----------
    array : numpy.ndarray or numpy.memmap
        The rows of one or more global batches.
    name : str
        What to call the source in errors.
    """

    array: np.ndarray
    name: str

    @property
    def dtype(self) -> np.dtype:
        """Element type."""
        return self.array.dtype

    def batch_shape(self, global_shape: tuple[int, ...] | None) -> tuple[int, ...]:
        """The global batch's shape: the whole array unless ``global_shape`` says fewer rows.

        Raises
        ------
        ValueError
            If the shapes disagree past dim 0, or the array has fewer rows than one batch.
        """
        have = tuple(int(n) for n in self.array.shape)
        if global_shape is None:
            return have
        want = tuple(int(n) for n in global_shape)
        if len(want) != len(have) or want[1:] != have[1:] or (want and want[0] > have[0]):
            raise ValueError(
                f"{self.name} has shape {list(have)}; a global batch of shape {list(want)} "
                "must match it past dim 0 and have at most as many rows"
            )
        return want

    def read(self, slices: tuple[slice, ...]) -> np.ndarray:
        """The elements of one slice, as a plain ndarray (a view: the copy happens once,
        when the slice goes to its devices)."""
        return np.asarray(self.array[slices])

    def check_rows(self, rows: int, step: int) -> int:
        """The row of the source where batch ``step`` starts.

        Raises
        ------
        ValueError
            If the source ends before that batch does.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        start = step * rows
        if start + rows > self.array.shape[0]:
            raise ValueError(
                f"{self.name} has {self.array.shape[0]} rows: batch {step} of {rows} rows "
                f"needs rows {start}:{start + rows}"
            )
        return start


def open_npy(path: str | os.PathLike) -> np.memmap:
    """Open a ``.npy`` file as a read-only memory map (nothing is read but the header).

    Raises
    ------
    ValueError
        If the file is not a single ``.npy`` array (e.g. an ``.npz`` archive).
    """
    arr = np.load(os.fspath(path), mmap_mode="r", allow_pickle=False)
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"{os.fspath(path)} is not a .npy array file; save one with np.save")
    return arr


@dataclass
class GrainSource:
    """A Grain ``MapDataset`` (or data source) whose records are the rows of a batch."""

    dataset: Any

    @property
    def dtype(self) -> np.dtype:
        """Element type of the first record."""
        return np.asarray(self.dataset[0]).dtype

    def batch_shape(self, global_shape: tuple[int, ...] | None) -> tuple[int, ...]:
        """The global batch's shape, which a record stream cannot guess.

        Raises
        ------
        ValueError
            Without ``global_shape``, or if a record's shape is not ``global_shape[1:]``.
        """
        if global_shape is None:
            raise ValueError(
                "a Grain source has no batch size: pass global_shape=(batch, *record_shape)"
            )
        want = tuple(int(n) for n in global_shape)
        record = tuple(np.asarray(self.dataset[0]).shape)
        if record != want[1:]:
            raise ValueError(
                f"records have shape {list(record)}; global_shape {list(want)} needs "
                f"records of shape {list(want[1:])}"
            )
        return want

    def local_rows(self, plan: DataPlan, me: ProcessReads, step: int) -> np.ndarray:
        """This process's rows of batch ``step``, from its share of the records.

        Processes that need the same rows (a model replica spanning processes) form one
        group and read the same share; otherwise each process is its own group and the
        share comes from ``grain.sharding.ShardByJaxProcess``.

        Raises
        ------
        ValueError
            If groups need different numbers of rows, or the share runs out of records.
        """
        import grain

        groups = plan.data_groups()
        sizes = {sum(b - a for a, b in rows) for rows, _ in groups}
        if len(sizes) != 1:
            raise ValueError(
                f"processes need different numbers of rows ({sorted(sizes)}); a record "
                "stream per process needs a sharding that splits the batch dim evenly"
            )
        per_process = sizes.pop()
        if all(len(procs) == 1 for _, procs in groups):
            opts = grain.sharding.ShardByJaxProcess(drop_remainder=True)
        else:
            group = next(i for i, (_, procs) in enumerate(groups) if me.process in procs)
            opts = grain.sharding.ShardOptions(
                shard_index=group, shard_count=len(groups), drop_remainder=True
            )
        ds = self.dataset
        if not isinstance(ds, grain.MapDataset):
            ds = grain.MapDataset.source(ds)
        usable = len(ds) // opts.shard_count * opts.shard_count
        share = ds[:usable][opts.shard_index :: opts.shard_count]
        start = step * per_process
        if step < 0 or start + per_process > len(share):
            raise ValueError(
                f"the dataset's share for shard {opts.shard_index} of {opts.shard_count} has "
                f"{len(share)} records; batch {step} needs records {start}:{start + per_process}"
            )
        return np.stack([np.asarray(share[i]) for i in range(start, start + per_process)])


def open_source(source: Any) -> ArraySource | GrainSource:
    """Wrap what :func:`~jaxsys_kernel.data.global_batch` was given.

    Raises
    ------
    TypeError
        For anything that is not an array, a ``.npy`` path or a Grain dataset.
    """
    if isinstance(source, str | os.PathLike):
        return ArraySource(open_npy(source), os.fspath(source))
    if isinstance(source, np.ndarray):
        kind = "memmap" if isinstance(source, np.memmap) else "array"
        return ArraySource(source, f"the {kind}")
    if _is_grain(source):
        return GrainSource(source)
    raise TypeError(
        f"cannot load a batch from {type(source).__qualname__}; pass a numpy array, an "
        "np.memmap, a .npy path, or a Grain MapDataset / data source"
    )


def rows_in(rows: tuple[tuple[int, int], ...], a: int, b: int) -> slice:
    """Where global rows ``a:b`` sit in the concatenation of ``rows`` (sorted ranges).

    Raises
    ------
    ValueError
        If ``a:b`` is not inside one of the ranges.
    """
    offset = 0
    for lo, hi in rows:
        if lo <= a and b <= hi:
            return slice(offset + a - lo, offset + b - lo)
        offset += hi - lo
    raise ValueError(f"rows {a}:{b} are not among this process's rows {list(rows)}")
