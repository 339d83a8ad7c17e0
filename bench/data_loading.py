"""Distributed data loading on 4 processes: who reads what, and how fast a batch is built.

What is measured
----------------
A cluster of 4 processes x 2 CPU devices is started in this process. A ``.npy`` file of
``--batches`` global batches (``--mib`` MiB each, float32 rows of 4 KiB) is written to a
temporary directory, and every process loads batches with
``jaxsys_kernel.data.global_batch``:

- **bytes read per process / total** for pure data parallelism (the batch split over all 8
  devices; target exactly 1/4 each), for data + model parallelism with each model replica
  inside a process and with replicas spanning processes (page layouts), and for the
  strategies that read more (one reader per device, every process reads everything). The
  shares come from ``data.stats(gather=True)``, the counters the loader keeps.
- **assembly throughput**: each process in turn (the others wait at a barrier, as if each
  process had its own host), side by side and alternating, loads a global batch (reads its
  quarter from the memory-mapped file, puts it on its two devices, builds the global
  ``jax.Array`` and waits until it is ready) and copies the same bytes from the same memory
  map with plain NumPy (``np.array(mm[rows])``). Both read from the page cache (the file is
  read once before timing). The ratio of the medians is reported per process (target
  >= 0.5x), with the ratio of the best times, which noise from other work on the machine
  affects least.

The load average is printed at the start and at the end: the machine may be shared.

Usage
-----
``python bench/data_loading.py [--mib 64] [--batches 4] [--repeats 15]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _procs import reap  # noqa: E402

from jaxsys_kernel import Cluster  # noqa: E402

# Measured without a standby: its engines would boot alongside what is measured
# (bench/faults.py measures the standby).
os.environ.setdefault("JAXSYS_STANDBY", "0")

N_PROCS = 4
DEVICES = 2
COLS = 1024  # float32: 4 KiB rows


def _shares(path, rows, layout, spec, strategy):
    """On each process: load one batch in a layout; every process's bytes read."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxsys_kernel import data

    devs = jax.devices()
    if layout == "flat":
        mesh = Mesh(np.array(devs), ("batch",))
    elif layout == "replica-in-process":  # (replica, model): a replica is one process
        mesh = Mesh(np.array(devs).reshape(4, 2), ("replica", "model"))
    else:  # "replica-across": replica r = device r of process p and of process p + 2
        order = [0, 4, 1, 5, 2, 6, 3, 7]
        mesh = Mesh(np.array([devs[i] for i in order]).reshape(4, 2), ("replica", "model"))
    s = NamedSharding(mesh, P(*spec))
    data.reset_stats()
    data.global_batch(path, s, (rows, 1024), strategy=strategy).block_until_ready()
    table = data.stats(gather=True)
    return [t.bytes_read for t in table]


def _throughput(path, rows, batches, repeats):
    """On each process, in turn: seconds of global_batch vs a NumPy copy of the same bytes."""
    import statistics
    import time

    import jax
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxsys_kernel import data

    s = NamedSharding(jax.make_mesh((jax.device_count(),), ("batch",)), P("batch"))
    mm = np.load(path, mmap_mode="r")
    np.asarray(mm).sum()  # into the page cache: both sides read memory, not the disk
    me = data.plan((rows, 1024), s).for_process(jax.process_index())
    (read,) = me.reads
    load_s, copy_s = [], []
    # One process at a time, as if each had its host to itself (this machine has 2 cores
    # for 4 processes); the others wait at a barrier.
    for turn in range(jax.process_count()):
        multihost_utils.sync_global_devices(f"turn {turn}")
        if turn != jax.process_index():
            continue
        for k in range(repeats):
            step = k % batches
            # Alternate which side goes first, so neither always finds a warmer cache.
            for side in ("load", "copy") if k % 2 == 0 else ("copy", "load"):
                t0 = time.perf_counter()
                if side == "load":
                    data.global_batch(path, s, (rows, 1024), step=step).block_until_ready()
                    load_s.append(time.perf_counter() - t0)
                else:
                    np.array(mm[read.slices(step * rows)])
                    copy_s.append(time.perf_counter() - t0)
    multihost_utils.sync_global_devices("turns done")
    return {
        "bytes": read.nbytes,
        "load": statistics.median(load_s),
        "copy": statistics.median(copy_s),
        "load_best": min(load_s),
        "copy_best": min(copy_s),
    }


LAYOUTS = [
    ("data parallel, per process", "flat", ("batch",), "process"),
    ("data parallel, per device", "flat", ("batch",), "device"),
    ("data parallel, every process reads all", "flat", ("batch",), "all"),
    ("data + model, replica inside a process", "replica-in-process", ("replica",), "process"),
    ("data + model, replicas across processes", "replica-across", ("replica",), "process"),
    ("fully replicated", "flat", (), "process"),
]


def measure(args: argparse.Namespace) -> int:
    rows = args.mib * 1024 * 1024 // (COLS * 4)
    rows -= rows % (N_PROCS * DEVICES)
    tmp = tempfile.mkdtemp(prefix="jaxsys-bench-data-")
    path = os.path.join(tmp, "batches.npy")
    np.save(path, np.random.default_rng(0).random((rows * args.batches, COLS), np.float32))
    print(
        f"{N_PROCS} processes x {DEVICES} devices; batch float32[{rows}, {COLS}] "
        f"({rows * COLS * 4 / 2**20:.0f} MiB), {args.batches} batches in {path}",
        flush=True,
    )
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    cluster = Cluster(hosts=N_PROCS, devices_per_host=DEVICES, progress=lambda e: None)
    started: list[psutil.Process] = []
    failed = False
    try:
        t0 = time.monotonic()
        cluster.start_sync()
        started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        print(f"cluster up in {time.monotonic() - t0:.1f} s\n", flush=True)
        print("bytes read per process / total (from data.stats(gather=True)):")
        for label, layout, spec, strategy in LAYOUTS:
            per = cluster.view.apply_sync(_shares, path, rows, layout, spec, strategy)[0]
            total = sum(per)
            shares = " ".join(f"{b / total:.4f}" for b in per)
            amp = total / (rows * COLS * 4)
            print(f"  {label:42s} {shares}  (read {amp:.2f} x the batch)")
            if strategy == "process" and layout == "flat" and spec:
                failed |= any(b * N_PROCS != total for b in per)
        print()
        res = cluster.view.apply_sync(_throughput, path, rows, args.batches, args.repeats)
        print(
            f"assembly throughput (data parallel, each process in turn, {args.repeats} "
            "loads and copies; median, then best):"
        )
        ratios = []
        for rank, r in enumerate(res):
            mib = r["bytes"] / 2**20
            ratio = r["copy"] / r["load"]
            ratios.append(ratio)
            print(
                f"  p{rank}: {mib:.1f} MiB: global_batch {mib / r['load']:.0f} MiB/s, "
                f"numpy copy {mib / r['copy']:.0f} MiB/s -> {ratio:.2f}x "
                f"(best: {mib / r['load_best']:.0f} vs {mib / r['copy_best']:.0f} MiB/s -> "
                f"{r['copy_best'] / r['load_best']:.2f}x)"
            )
        print(
            f"  median ratio {statistics.median(ratios):.2f}x, worst {min(ratios):.2f}x "
            "(target >= 0.5x)"
        )
        failed |= statistics.median(ratios) < 0.5
    finally:
        cluster.kill()
        left = reap(started, timeout=10)
        if left:
            print(f"warning: {len(left)} process(es) outlived the cluster and were killed")
        os.remove(path)
        os.rmdir(tmp)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="MiB per global batch")
    ap.add_argument("--batches", type=int, default=4, help="batches in the file")
    ap.add_argument("--repeats", type=int, default=15, help="timed loads per process")
    return measure(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
