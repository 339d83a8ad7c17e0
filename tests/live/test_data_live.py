"""Distributed data loading on a live cluster of 2 processes x 2 CPU devices.

Each process must read exactly its planned bytes, the global array must equal the
reference on every shard (and across processes, through a jitted reduction), a ``.npy``
file must be read only where a process's slices are (the page cache shows it, process by
process), and a Grain dataset must be split by Grain's per-process sharding.
"""

from __future__ import annotations

import numpy as np
import pytest

ROWS, COLS = 64, 1024  # 256 KiB of float32: each process's half is 128 KiB


def reference() -> np.ndarray:
    # Small integers: float32 sums of them are exact, so a cross-process sum is checkable.
    return (np.arange(ROWS * COLS) % 7).astype(np.float32).reshape(ROWS, COLS)


@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    path = tmp_path_factory.mktemp("data-live") / "batch.npy"
    np.save(path, reference())
    return str(path)


def _load(path, layout, spec, strategy, source="path"):
    """On each process: load, check every shard, sum across processes, gather the stats."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxsys_kernel import data

    rows, cols = 64, 1024
    ref = (np.arange(rows * cols) % 7).astype(np.float32).reshape(rows, cols)
    devs = jax.devices()
    if layout == "natural":  # each process's devices are one row of the mesh
        grid = [[devs[0], devs[1]], [devs[2], devs[3]]]
    else:  # "across": each row of the mesh (a model replica) spans both processes
        grid = [[devs[0], devs[2]], [devs[1], devs[3]]]
    s = NamedSharding(Mesh(np.array(grid), ("data", "model")), P(*spec))
    src = {"path": path, "memmap": np.load(path, mmap_mode="r"), "array": ref}[source]
    data.reset_stats()
    x = data.global_batch(src, s, (rows, cols), strategy=strategy)
    shards_ok = all(
        np.array_equal(np.asarray(sh.data), ref[sh.index]) for sh in x.addressable_shards
    )
    total = float(jax.jit(lambda a: a.sum())(x))
    table = data.stats(gather=True)
    me = data.plan((rows, cols), s, strategy=strategy).for_process(jax.process_index())
    return {
        "shards_ok": shards_ok,
        "total": total,
        "bytes": [t.bytes_read for t in table],
        "slices": [t.slices_read for t in table],
        "planned": me.nbytes,
        "shared_with": sorted({p for r in me.reads for p in r.shared_with}),
    }


CASES = [
    # (layout, spec, strategy, source, bytes read by each process, slices each)
    ("natural", ("data",), "process", "path", 128 * 1024, 1),  # pure data parallelism
    ("natural", ("data", "model"), "process", "memmap", 128 * 1024, 1),  # two blocks, one read
    ("natural", ("data",), "device", "array", 256 * 1024, 2),  # both devices read the rows
    ("natural", (None, "data"), "process", "path", 128 * 1024, 1),  # columns: 64 runs each
    ("natural", (), "process", "path", 256 * 1024, 1),  # full replication
    ("across", ("data",), "process", "path", 256 * 1024, 1),  # replicas span processes
    ("natural", ("data",), "all", "path", 256 * 1024, 1),  # everyone reads everything
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{c[3]}")
def test_each_process_reads_its_planned_bytes(cluster, npy, case):
    layout, spec, strategy, source, each, slices = case
    results = cluster.view.apply_sync(_load, npy, layout, spec, strategy, source)
    want_total = float(reference().sum())
    for rank, r in enumerate(results):
        assert r["shards_ok"], (rank, r)
        assert r["total"] == want_total, (rank, r)
        assert r["bytes"] == [each, each], (rank, r)
        assert r["slices"] == [slices, slices], (rank, r)
        assert r["planned"] == each
    if layout == "across" or spec == ():
        assert [r["shared_with"] for r in results] == [[1], [0]]
    elif strategy != "all":
        assert [r["shared_with"] for r in results] == [[], []]


def _load_alone(path, loader):
    """Only process ``loader`` loads its half; return which pages of the file got cached."""
    import ctypes
    import gc
    import mmap
    import os

    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxsys_kernel import data

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

    def pages():
        size = os.path.getsize(path)
        fd = os.open(path, os.O_RDONLY)
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        vec = ctypes.create_string_buffer((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE)
        assert libc.mincore(addr, size, vec) == 0
        libc.munmap(addr, size)
        os.close(fd)
        return [i for i, b in enumerate(vec.raw) if b & 1]

    data.close_files()
    gc.collect()  # maps of earlier loads would keep their pages cached
    multihost_utils.sync_global_devices("collected")
    if jax.process_index() == 0:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)  # dirty pages (the file was just written) cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    multihost_utils.sync_global_devices("dropped")
    before = pages()
    multihost_utils.sync_global_devices("measured")  # nobody loads before all have looked
    data.reset_stats()
    s = NamedSharding(jax.make_mesh((4,), ("batch",)), P("batch"))
    if jax.process_index() == loader:
        # Building the global array is local to each process: no other process takes part.
        data.global_batch(path, s, (64, 1024)).block_until_ready()
    multihost_utils.sync_global_devices("loaded")
    return {"before": before, "after": pages(), "bytes": data.stats().bytes_read}


def test_npy_pages_read_are_the_process_half(cluster, npy):
    page = 4096
    header = 1  # the .npy header's page
    half_pages = 128 * 1024 // page
    seen = []
    for loader in (0, 1):
        results = cluster.view.apply_sync(_load_alone, npy, loader)
        if any(r["before"] for r in results):
            pytest.skip("this filesystem keeps the file cached after POSIX_FADV_DONTNEED")
        assert [r["bytes"] for r in results] == [128 * 1024 if i == loader else 0 for i in (0, 1)]
        cached = results[loader]["after"]
        # The data of rows 32*loader .. 32*loader+32 starts 128 bytes into the file: its
        # pages, plus at most the pages the header and the boundary share.
        assert half_pages <= len(cached) <= half_pages + header + 1, cached
        seen.append(set(cached))
    # Both read the header's page; the halves meet inside page 32 (data starts 128 bytes in).
    assert seen[0] & seen[1] <= {0, half_pages}


def _grain_batch(layout, step):
    import grain
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxsys_kernel import data

    records = np.arange(40 * 3, dtype=np.int32).reshape(40, 3)
    devs = jax.devices()
    grid = [[devs[0], devs[1]], [devs[2], devs[3]]]
    if layout == "across":
        grid = [[devs[0], devs[2]], [devs[1], devs[3]]]
    s = NamedSharding(Mesh(np.array(grid), ("data", "model")), P("data"))
    data.reset_stats()
    x = data.global_batch(grain.MapDataset.source(records), s, (8, 3), step=step)
    st = data.stats()
    shards = {str(sh.index[0]): np.asarray(sh.data).tolist() for sh in x.addressable_shards}
    return {"shards": shards, "bytes": st.bytes_read, "slices": st.slices_read}


def test_grain_dataset_split_by_jax_process(cluster):
    records = np.arange(40 * 3, dtype=np.int32).reshape(40, 3)
    results = cluster.view.apply_sync(_grain_batch, "natural", 1)
    for rank, r in enumerate(results):
        # ShardByJaxProcess: process p takes records p, p + 2, ...; batch 1 is the second
        # run of 4 of them, placed in process p's rows of the global batch.
        want = records[rank::2][4:8]
        rows = slice(4 * rank, 4 * rank + 4, None)
        assert r["shards"] == {str(rows): want.tolist()}, (rank, r)
        assert r["bytes"] == 4 * 3 * 4 and r["slices"] == 4


def test_grain_processes_holding_one_replica_read_the_same_records(cluster):
    records = np.arange(40 * 3, dtype=np.int32).reshape(40, 3)
    results = cluster.view.apply_sync(_grain_batch, "across", 0)
    # Both processes need all 8 rows, so they form one group and read the same share.
    for r in results:
        got = {k: v for k, v in r["shards"].items()}
        assert got == {
            str(slice(0, 4, None)): records[0:4].tolist(),
            str(slice(4, 8, None)): records[4:8].tolist(),
        }
        assert r["bytes"] == 8 * 3 * 4
