"""Build a global ``jax.Array`` from only the slices this process's devices need.

Runs inside each JAX process (it imports JAX; the kernel imports only the planner). The
reads come from :func:`~jaxsys_kernel.data.planner.plan`; each shard is cut from the read
that holds it and put on its device. When a process's devices need one box of the batch and the process read
exactly that box, ``jax.make_array_from_process_local_data`` assembles the array; any
other layout (several boxes, one reader per device, everything read) goes through
``jax.make_array_from_single_device_arrays``.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import numpy as np

from .counters import COUNTER
from .planner import DataPlan, ProcessReads, box_size, plan
from .sources import ArraySource, GrainSource, open_source, rows_in


@functools.lru_cache(maxsize=64)
def _plan(shape: tuple[int, ...], sharding: Any, dtype: str, strategy: str) -> DataPlan:
    # A loop loads batch after batch with one sharding: plan once (shardings are hashable).
    return plan(shape, sharding, dtype, strategy=strategy)


def _devices(sharding: Any) -> dict[int, Any]:
    return {int(d.id): d for d in sharding.addressable_devices}


def _assemble(p: DataPlan, me: ProcessReads, datas: list[np.ndarray], sharding: Any) -> Any:
    """The global array from this process's reads."""
    shape = p.shape
    if p.strategy == "process" and len(me.reads) == 1:
        # One box feeds every local device: JAX cuts it into shards itself.
        return jax.make_array_from_process_local_data(sharding, datas[0], shape)
    by_id = _devices(sharding)
    devices, pieces = [], []
    for dev, _ in me.devices:
        k, inner = me.read_for(dev)
        devices.append(by_id[dev])
        pieces.append(datas[k][inner])
    arrays = jax.device_put(pieces, devices)
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


def _read(src: ArraySource | GrainSource, p: DataPlan, me: ProcessReads, step: int):
    """This process's reads of batch ``step``, with the bytes and slices they took."""
    if isinstance(src, GrainSource):
        if p.strategy != "process":
            raise ValueError(
                f"a Grain source is read by one pipeline per process; strategy={p.strategy!r} "
                "needs an array or .npy source"
            )
        return _grain_reads(src, p, me, step)
    offset = src.check_rows(p.shape[0], step)
    datas = [src.read(r.slices(offset)) for r in me.reads]
    return datas, sum(box_size(r.index) for r in me.reads) * p.itemsize, len(me.reads)


def _grain_reads(src: GrainSource, p: DataPlan, me: ProcessReads, step: int):
    """This process's reads cut out of its rows of the record stream."""
    local = src.local_rows(p, me, step)
    datas = []
    for r in me.reads:
        rows = rows_in(me.rows, *r.index[0])
        datas.append(local[(rows, *r.slices()[1:])])
    return datas, local.nbytes, local.shape[0]


def global_batch(
    source: Any,
    sharding: Any,
    global_shape: tuple[int, ...] | None = None,
    *,
    strategy: str = "process",
    step: int = 0,
) -> Any:
    """Load a global batch, reading only the slices this process's devices need.

    Call it on every process; each reads its own slices and the result is one
    ``jax.Array`` spanning all processes (counted in :func:`~jaxsys_kernel.data.stats`).

    Parameters
    ----------
    source : numpy.ndarray, numpy.memmap, str or os.PathLike, or Grain dataset
        An array (one or more global batches along dim 0), a ``.npy`` path (memory-mapped
        and read by slices; see :func:`~jaxsys_kernel.data.close_files`), or a Grain
        ``MapDataset`` / random-access source whose records are rows.
    sharding : jax.sharding.Sharding
        The layout of the global batch.
    global_shape : tuple of int, optional
        The batch's shape; by default the whole array. Required for a Grain source.
    strategy : {"process", "device", "all"}, optional
        One reader per process (the default), one per device, or every process reads
        everything (see :func:`~jaxsys_kernel.data.planner.plan`); Grain: ``"process"`` only.
    step : int, optional
        Which batch: rows ``step * B`` to ``(step + 1) * B`` of an array, or the
        ``step``-th run of this process's share of a Grain source.

    Returns
    -------
    jax.Array
        The global batch, laid out by ``sharding``. A source of an unknown kind raises
        TypeError; shapes that do not fit or a step past the end raise ValueError.

    Examples
    --------
    ::

        %%multihost
        mesh = jax.make_mesh((jax.device_count(),), ("batch",))
        x = data.global_batch("train.npy", NamedSharding(mesh, P("batch")), (256, 784))
    """
    t0 = time.perf_counter()
    src = open_source(source)
    shape = src.batch_shape(None if global_shape is None else tuple(global_shape))
    if not shape:
        raise ValueError("a global batch needs at least one dim (the batch dim)")
    try:
        p = _plan(shape, sharding, src.dtype.str, strategy)
    except TypeError:  # an unhashable sharding
        p = plan(shape, sharding, src.dtype, strategy=strategy)
    me = p.for_process(jax.process_index())
    datas, nbytes, slices = _read(src, p, me, step)
    out = _assemble(p, me, datas, sharding)
    COUNTER.add(nbytes, slices, time.perf_counter() - t0)
    return out
