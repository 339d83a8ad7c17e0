"""One merged timeline: trace sizes, transfer and merge time, clock offsets, at 4 and 16.

What is measured
----------------
For each cluster size (4 and 16 processes, 1 CPU device each), one cell of a few jitted
steps over a global array is run with the ``profile`` cell hook; then
:func:`jaxsys_kernel.cells.timeline.collect` measures each process's clock offset against
the kernel (best of 5 round trips), fetches every trace in pieces over ``Cluster.call``,
and merges and saves them. Printed: the gzipped trace size per process, the transfer time
(offsets + fetch), the merge-and-save time, the profiled cell's time next to the same cell
without the hook (ratio, side by side in one run), and the offsets with their errors.

Usage
-----
``python bench/profile.py [--sizes 4,16]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from jaxsys_kernel import Cluster
from jaxsys_kernel import cells as executor
from jaxsys_kernel.cells import timeline

# Measured without a standby: its engines would boot alongside what is measured
# (bench/faults.py measures the standby).
os.environ.setdefault("JAXSYS_STANDBY", "0")


CELL = """\
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("x",))
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("x")), np.ones((64, 64), np.float32))
@jax.jit
def bench_step(v):
    return jnp.sum(v @ v.T)
for _ in range(5):
    bench_step(x).block_until_ready()
"""


class Quiet(executor.Sink):
    def stdout(self, text):
        pass

    def stderr(self, text):
        pass


def timed(cluster, hooks) -> float:
    t0 = time.perf_counter()
    run = executor.execute(cluster, CELL, sink=Quiet(), hooks=hooks, timeout=300)
    if run.failed():
        raise RuntimeError(f"the cell failed: {run.results}")
    return time.perf_counter() - t0


def one_size(n: int) -> None:
    # The merged traces would otherwise be kept in jaxsys-traces/ here.
    bench_dir = tempfile.mkdtemp(prefix="jaxsys-bench-traces-")
    cluster = Cluster(hosts=n, devices_per_host=1, progress=lambda e: None)
    cluster.start_sync()
    try:
        timed(cluster, None)  # compile once, untimed
        plain = [timed(cluster, None) for _ in range(3)]
        profiled = timed(cluster, {"profile": {}})
        got = timeline.collect(cluster, cluster.ranks, f"bench-{n}", bench_dir)
        sizes = sorted(got["sizes"].values())
        print(f"{n} processes:")
        print(
            f"  trace per process (gzipped): min {sizes[0] / 1e3:.0f} kB, "
            f"max {sizes[-1] / 1e3:.0f} kB; merged file {os.path.getsize(got['path']) / 1e6:.1f} MB"
        )
        print(
            f"  transfer (offsets + fetch) {got['transfer_s']:.2f} s, merge + save {got['merge_s']:.2f} s"
        )
        print(
            f"  profiled cell {profiled:.2f} s vs plain {statistics.median(plain):.2f} s "
            f"(ratio {profiled / statistics.median(plain):.2f})"
        )
        offs = got["offsets"].values()
        print(
            "  clock offsets: "
            f"{min(o.seconds for o in offs) * 1e3:+.3f} to {max(o.seconds for o in offs) * 1e3:+.3f} ms, "
            f"errors up to {max(o.error for o in offs) * 1e3:.3f} ms"
        )
    finally:
        cluster.kill()
        shutil.rmtree(bench_dir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,16")
    opts = ap.parse_args()
    for n in (int(s) for s in opts.sizes.split(",")):
        one_size(n)
    print("load average: " + " ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()
