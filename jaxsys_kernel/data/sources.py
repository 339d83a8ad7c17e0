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

import functools
import mmap
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib import format as npformat

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
    mapping : mmap.mmap, optional
        The map behind ``array`` when this module opened the file (:func:`open_npy`):
        reads then tell the kernel exactly which pages they need.
    """

    array: np.ndarray
    name: str
    mapping: mmap.mmap | None = None

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
        """The elements of one slice, copied into this process's memory, read-only."""
        view = self.array[slices]
        if self.mapping is not None and view.size:
            _will_need(self.mapping, self.array, view)
        return _owned(view)

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


# JAX on CPU takes a host buffer without copying it only when it is aligned this much.
ALIGN = 64


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised C-ordered array whose data starts on an :data:`ALIGN` boundary."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + nbytes].view(dt).reshape(shape)


def _owned(values: np.ndarray) -> np.ndarray:
    """A private, aligned, read-only copy.

    On CPU, JAX aliases aligned read-only host buffers instead of copying them. A view of
    a read-only memory map would then be read lazily, whenever a computation touches it,
    and would change if the file did; a private copy is read now, once, and being aligned
    and read-only it goes to the devices without a second copy.
    """
    out = aligned_empty(values.shape, values.dtype)
    np.copyto(out, values)
    out.flags.writeable = False
    return out


def _will_need(mapping: mmap.mmap, array: np.ndarray, view: np.ndarray) -> None:
    """Ask the kernel to read exactly the pages under ``view`` (a slice of ``array``).

    The map was opened with ``MADV_RANDOM``, so faults do not read ahead into rows that
    other processes load; this brings in the slice's own pages in large requests.
    """
    base = array.__array_interface__["data"][0] - _address(mapping)
    first = view.__array_interface__["data"][0] - array.__array_interface__["data"][0]
    # The byte span from the slice's first element to its last; for a slice of whole rows
    # that is exactly the slice, otherwise it also covers the gaps between its runs.
    last = first + sum((n - 1) * st for n, st in zip(view.shape, view.strides, strict=True))
    start = (base + first) // mmap.PAGESIZE * mmap.PAGESIZE
    stop = base + last + view.itemsize
    mapping.madvise(mmap.MADV_WILLNEED, start, stop - start)


def _address(mapping: mmap.mmap) -> int:
    """Where a read-only map starts in memory."""
    return np.frombuffer(mapping, dtype=np.uint8, count=0).__array_interface__["data"][0]


class _OpenFiles:
    """The last few ``.npy`` files opened, kept mapped while they do not change.

    A loader reads the same file batch after batch; mapping it again each time would cost
    a fresh page-table entry for every page read. A file whose inode, size or modification
    time changed is mapped again.
    """

    def __init__(self, size: int = 8) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._files: dict[str, tuple[tuple, np.ndarray, mmap.mmap]] = {}

    def get(self, path: str | os.PathLike) -> tuple[np.ndarray, mmap.mmap]:
        name = os.path.realpath(os.fspath(path))
        st = os.stat(name)
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._files.pop(name, None)
            if hit is None or hit[0] != key:
                hit = (key, *_open_npy(name))
            self._files[name] = hit  # most recently used last
            while len(self._files) > self._size:
                self._files.pop(next(iter(self._files)))
        return hit[1], hit[2]

    def clear(self) -> int:
        """Forget every file; returns how many were open."""
        with self._lock:
            n = len(self._files)
            self._files.clear()
        return n


OPEN_FILES = _OpenFiles()


def close_files() -> int:
    """Let go of the ``.npy`` files :func:`~jaxsys_kernel.data.global_batch` keeps mapped.

    Their maps close once no array uses them (batches are copies, so none do). Until then a
    mapped file's pages cannot be evicted from the page cache, and on some systems the file
    cannot be replaced.

    Returns
    -------
    int
        How many files were open.
    """
    return OPEN_FILES.clear()


def open_npy(path: str | os.PathLike) -> np.ndarray:
    """Open a ``.npy`` file as a read-only memory map (nothing is read but the header).

    Raises
    ------
    ValueError
        If the file is not a single ``.npy`` array (e.g. an ``.npz`` archive).
    """
    return _open_npy(path)[0]


def _open_npy(path: str | os.PathLike) -> tuple[np.ndarray, mmap.mmap]:
    name = os.fspath(path)
    with open(name, "rb", buffering=0) as f:
        # Readahead would pull in the rows after a slice, which belong to other processes;
        # without it the header costs one page.
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
        try:
            version = npformat.read_magic(f)
        except ValueError:
            raise ValueError(f"{name} is not a .npy array file; save one with np.save") from None
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = npformat.read_array_header_2_0(f)
        else:
            raise ValueError(f"{name}: .npy format {version} is not supported; use 1.0 or 2.0")
        if dtype.hasobject:
            raise ValueError(f"{name} holds Python objects, which cannot be memory-mapped")
        offset = f.tell()
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    mapping.madvise(mmap.MADV_RANDOM)
    order = "F" if fortran else "C"
    array = np.ndarray(shape, dtype, buffer=mapping, offset=offset, order=order)
    return array, mapping


@dataclass
class GrainSource:
    """A Grain ``MapDataset`` (or data source) whose records are the rows of a batch.

    The first record is read once, to learn the records' shape and type before planning;
    that read is not counted in the statistics.
    """

    dataset: Any

    @functools.cached_property
    def _first(self) -> np.ndarray:
        return np.asarray(self.dataset[0])

    @property
    def dtype(self) -> np.dtype:
        """Element type of the first record."""
        return self._first.dtype

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
        record = tuple(self._first.shape)
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
        # Deferred: grain takes about two seconds to import; only Grain sources need it.
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
        records = [np.asarray(share[i]) for i in range(start, start + per_process)]
        rows = aligned_empty((per_process, *records[0].shape), records[0].dtype)
        np.stack(records, out=rows)
        rows.flags.writeable = False  # a private copy: the devices may take it as is
        return rows


def open_source(source: Any) -> ArraySource | GrainSource:
    """Wrap what :func:`~jaxsys_kernel.data.global_batch` was given.

    Raises
    ------
    TypeError
        For anything that is not an array, a ``.npy`` path or a Grain dataset.
    """
    if isinstance(source, str | os.PathLike):
        array, mapping = OPEN_FILES.get(source)
        return ArraySource(array, os.fspath(source), mapping)
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
