"""Loading global batches with real JAX in one process of 8 CPU devices (a child process).

Every layout, strategy and kind of source must give the reference array; a ``.npy`` file is
read by slices (the page cache proves it: after loading one batch of sixteen, only that
batch's pages were read from the file); plans of real shardings match the simulated ones.
The cross-process cases run on a live cluster in ``test_data_live``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    r"""
    import ctypes, json, mmap, os, sys
    import numpy as np
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    from jaxsys_kernel import data
    from jaxsys_kernel.engine.simulate import FakeNamedSharding, fake_devices, fake_mesh

    tmp = sys.argv[1]
    out = {}
    ref = np.arange(64 * 12, dtype=np.float32).reshape(64, 12)
    path = os.path.join(tmp, "batches.npy")
    both = np.concatenate([ref, ref + 1000])
    np.save(path, both)

    SPECS = [("x",), (None, "y"), ("x", "y"), (), ("y",), (("x", "y"),), ("y", "x")]
    cases = []
    for spec in SPECS:
        mesh = jax.make_mesh((4, 2), ("x", "y"))
        s = NamedSharding(mesh, P(*spec))
        fake = FakeNamedSharding(fake_mesh(fake_devices(8, 8), (4, 2), ("x", "y")), spec)
        real_plan = data.plan((64, 12), s)
        fake_plan = data.plan((64, 12), fake)
        same = [r.index for r in real_plan.processes[0].reads] == [
            r.index for r in fake_plan.processes[0].reads]
        for strategy in data.STRATEGIES:
            for kind, src in (("array", both), ("memmap", np.load(path, mmap_mode="r")),
                              ("path", path)):
                for step, want in ((0, ref), (1, ref + 1000)):
                    data.reset_stats()
                    x = data.global_batch(src, s, (64, 12), strategy=strategy, step=step)
                    st = data.stats()
                    cases.append({
                        "case": f"{spec} {strategy} {kind} step {step}",
                        "equal": bool(np.array_equal(np.asarray(x), want)),
                        "sharding": x.sharding == s,
                        "bytes": st.bytes_read,
                        "planned": data.plan((64, 12), s, strategy=strategy).total_read,
                        "plan_matches_fake": same,
                    })
    out["cases"] = cases

    # The page cache shows which parts of a file were read.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

    def resident(p):
        size = os.path.getsize(p)
        fd = os.open(p, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            page = mmap.PAGESIZE
            vec = ctypes.create_string_buffer((size + page - 1) // page)
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
            libc.munmap(addr, size)
        finally:
            os.close(fd)
        return sum(b & 1 for b in vec.raw) * mmap.PAGESIZE

    def drop(p):
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

    big = os.path.join(tmp, "big.npy")
    rows, cols = 16 * 256, 1024  # 16 batches of 1 MiB of float32
    np.save(big, np.arange(rows * cols, dtype=np.float32).reshape(rows, cols))
    drop(big)
    before = resident(big)
    mesh = jax.make_mesh((8,), ("b",))
    data.reset_stats()
    x = data.global_batch(big, NamedSharding(mesh, P("b")), (256, cols), step=5)
    x.block_until_ready()
    out["npy"] = {
        "file": os.path.getsize(big), "before": before, "after": resident(big),
        "counted": data.stats().bytes_read,
        "first": float(np.asarray(x.addressable_shards[0].data)[0, 0]), "want_first": float(5 * 256 * cols),
    }

    import grain
    records = ref.copy()
    ds = grain.MapDataset.source(records)
    s = NamedSharding(jax.make_mesh((8,), ("b",)), P("b"))
    data.reset_stats()
    g = data.global_batch(ds, s, (16, 12), step=2)
    out["grain"] = {"equal": bool(np.array_equal(np.asarray(g), records[32:48])),
                    "bytes": data.stats().bytes_read, "slices": data.stats().slices_read}
    g2 = data.global_batch(grain.sources.RangeDataSource(0, 40, 1),
                           NamedSharding(jax.make_mesh((8,), ("b",)), P("b")), (8,), step=1)
    out["grain_range"] = np.asarray(g2).tolist()

    errors = {}
    def err(name, fn):
        try:
            fn()
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {e}"
    s = NamedSharding(jax.make_mesh((8,), ("b",)), P("b"))
    err("shape", lambda: data.global_batch(ref, s, (64, 13)))
    err("step", lambda: data.global_batch(path, s, (64, 12), step=2))
    err("grain_shape", lambda: data.global_batch(ds, s))
    err("grain_record", lambda: data.global_batch(ds, s, (16, 3)))
    err("grain_strategy", lambda: data.global_batch(ds, s, (16, 12), strategy="device"))
    err("grain_end", lambda: data.global_batch(ds, s, (16, 12), step=4))
    err("type", lambda: data.global_batch(3.0, s))
    np.savez(os.path.join(tmp, "a.npz"), a=ref)
    err("npz", lambda: data.global_batch(os.path.join(tmp, "a.npz"), s))
    err("scalar", lambda: data.global_batch(np.array(1.0, np.float32), s))
    out["errors"] = errors

    data.reset_stats()
    data.global_batch(ref, s)
    table = data.stats(gather=True)
    first = data.stats(reset=True)
    out["stats"] = {"rows": len(table), "bytes": table[0].bytes_read, "batches": first.batches,
                    "after_reset": data.stats().bytes_read, "text": str(table)}
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path_factory.mktemp("data"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_layout_strategy_and_source_gives_the_reference(result):
    bad = [c["case"] for c in result["cases"] if not (c["equal"] and c["sharding"])]
    assert not bad, bad
    assert len(result["cases"]) == 7 * 3 * 3 * 2


def test_bytes_read_are_the_planned_bytes(result):
    # One process holds all 8 devices: per-process plans read the batch once, per-device
    # plans once per device holding a copy, and "all" once.
    for c in result["cases"]:
        assert c["bytes"] == c["planned"], c["case"]
        if " process " in c["case"] or " all " in c["case"]:
            assert c["bytes"] == 64 * 12 * 4, c["case"]


def test_plans_of_real_shardings_match_simulated_ones(result):
    assert all(c["plan_matches_fake"] for c in result["cases"])


def test_npy_is_read_by_slices_never_whole(result):
    npy = result["npy"]
    if npy["before"] != 0:
        pytest.skip("this filesystem keeps the file cached after POSIX_FADV_DONTNEED")
    batch = 256 * 1024 * 4
    assert npy["counted"] == batch
    assert npy["first"] == npy["want_first"]
    # The pages of one batch, plus the header's page and the few neighbours the kernel maps
    # around a fault; no readahead into the other fifteen batches of the 16 MiB file.
    assert batch <= npy["after"] <= batch + 64 * 1024, npy
    assert npy["after"] < npy["file"] / 4


def test_grain_source(result):
    assert result["grain"]["equal"]
    assert result["grain"]["bytes"] == 16 * 12 * 4
    assert result["grain"]["slices"] == 16
    assert result["grain_range"] == list(range(8, 16))


def test_errors_say_what_to_do(result):
    e = result["errors"]
    assert "must match it past dim 0" in e["shape"]
    assert "batch 2 of 64 rows needs rows 128:192" in e["step"]
    assert "pass global_shape=(batch, *record_shape)" in e["grain_shape"]
    assert "records of shape [3]" in e["grain_record"]
    assert "strategy='device' needs an array or .npy source" in e["grain_strategy"]
    assert "batch 4 needs records 64:80" in e["grain_end"]
    assert e["type"].startswith("TypeError: cannot load a batch from float")
    assert "not a .npy array file" in e["npz"]
    assert "at least one dim" in e["scalar"]


def test_stats_gather_and_reset(result):
    st = result["stats"]
    assert st["rows"] == 1 and st["bytes"] == 64 * 12 * 4 and st["batches"] == 1
    assert st["after_reset"] == 0
    assert "p0: read 3.0 KiB (3072 bytes) in 1 slice, 1 batch" in st["text"]
    assert "share 1.0000" in st["text"]

