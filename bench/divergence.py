"""The divergence check: how soon a diverging dispatch is named, and what the check costs.

What is measured
----------------
On one local cluster (4 processes x 1 CPU device by default):

1. **Time to the sentence**, per case: each diverging cell prints ``time.time()`` just
   before the diverging dispatch; the sentence's arrival under the cell is timed with the
   same clock (one machine). Cases: a different shape (the silent wrong sum), a different
   function, a skipped collective, two collectives in another order, a process asleep.
   A hung cell is stopped after its timeout and the world restarted.
2. **Cost**, as ratios measured side by side in one run (A B A B ...): a trivial cell
   (``x = 1``, the dispatch benchmark's cell) and a cell of 20 training steps of a jitted
   function already compiled, each with the check and without. Median cell time with /
   without.

Usage
-----
``python bench/divergence.py [--reps N] [--hosts N]``
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time

from jaxsys_kernel import Cluster
from jaxsys_kernel import cells as executor

# Measured without a standby: its engines would boot alongside what is measured
# (bench/faults.py measures the standby).
os.environ.setdefault("JAXSYS_STANDBY", "0")


SETUP = """\
import time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
me = jax.process_index()
mesh = Mesh(np.array(jax.devices()), ("x",))
rows = NamedSharding(mesh, P("x"))
def global_rows(n):
    local = np.ones((n * jax.local_device_count(), 4), np.float32)
    return jax.make_array_from_process_local_data(rows, local)
"""

CASES = {
    "different shape (silent wrong sum)": """
x = global_rows(3 if me == 1 else 2)
print("T0=%f" % time.time())
jax.jit(jnp.sum)(x)
""",
    "different function": """
def fa{n}(v): return jnp.sum(v * 2)
def fb{n}(v): return jnp.sum(v * 3) + 1
x = global_rows(2)
print("T0=%f" % time.time())
jax.jit(fb{n} if me == 3 else fa{n})(x)
""",
    "skipped collective": """
def skip{n}(v): return jnp.sum(v)
x = global_rows(2)
print("T0=%f" % time.time())
if me != 2:
    jax.jit(skip{n})(x)
""",
    "two collectives in another order": """
def one{n}(v): return jnp.sum(v)
def two{n}(v): return jnp.max(v)
x = global_rows(2)
print("T0=%f" % time.time())
for fn in ((two{n}, one{n}) if me == 2 else (one{n}, two{n})):
    jax.jit(fn)(x)
""",
    "process asleep in Python": """
def waited{n}(v): return jnp.sum(v)
x = global_rows(2)
if me == 1:
    time.sleep(30)
print("T0=%f" % time.time())
jax.jit(waited{n})(x)
""",
}

STEP_SETUP = """
x = global_rows(64)
w = jnp.ones((4, 4), jnp.float32)
@jax.jit
def step(w, x):
    return w - 0.01 * (x @ w).T @ x / x.shape[0]
w = step(w, x)
"""
STEPS = "for _ in range(20):\n    w = step(w, x)\nw.block_until_ready()\n"


class Timed(executor.Sink):
    """Keeps stdout and the arrival time of every stderr piece."""

    def __init__(self):
        super().__init__()
        self.out: list[str] = []
        self.err: list[tuple[float, str]] = []

    def stdout(self, text):
        self.out.append(text)

    def stderr(self, text):
        self.err.append((time.time(), text))


def run(cluster, code, check=True, timeout=None):
    sink = Timed()
    t0 = time.perf_counter()
    r = executor.execute(
        cluster,
        code,
        sink=sink,
        timeout=timeout,
        grace=3.0,
        on_hang=lambda _run: "restart",
        hooks={"divergence": {}} if check else None,
        known=set(),
    )
    took = time.perf_counter() - t0
    if r.hang_action == "restart":
        cluster.restart_sync()
        run(cluster, SETUP)
    return took, sink


def time_to_sentence(cluster) -> None:
    print("time from the diverging dispatch to the sentence:")
    for n, (name, code) in enumerate(CASES.items()):
        _, sink = run(cluster, code.replace("{n}", str(n)), timeout=10)
        sent = [
            (t, s)
            for t, s in sink.err
            if s.startswith("jaxsys: ") and (" ran " in s or "stuck" in s)
        ]
        marks = [float(m) for m in re.findall(r"T0=([0-9.]+)", "".join(sink.out))]
        if not sent or not marks:
            print(f"  {name:36s} not named ({sink.err!r})")
            continue
        print(f"  {name:36s} {sent[0][0] - min(marks):5.2f} s  {sent[0][1].strip()[:90]}")


def cost(cluster, reps: int) -> None:
    run(cluster, STEP_SETUP)
    for label, code in (("trivial cell (x = 1)", "x = 1"), ("20 training steps", STEPS)):
        on, off = [], []
        for _ in range(2):  # warm-up, untimed
            run(cluster, code, True)
            run(cluster, code, False)
        for _ in range(reps):
            on.append(run(cluster, code, True)[0])
            off.append(run(cluster, code, False)[0])
        a, b = statistics.median(on), statistics.median(off)
        print(f"  {label:24s} with {a * 1e3:7.1f} ms  without {b * 1e3:7.1f} ms  ratio {a / b:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--hosts", type=int, default=4)
    opts = ap.parse_args()
    cluster = Cluster(hosts=opts.hosts, devices_per_host=1, progress=lambda e: None)
    cluster.start_sync()
    try:
        run(cluster, SETUP)
        time_to_sentence(cluster)
        print("cost of the check (median cell time, alternating with / without):")
        cost(cluster, opts.reps)
    finally:
        cluster.kill()
    print("load average: " + " ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()
