"""A step's end is when its devices finish, not when the jitted call returns, and the
recorder does not hold the host to see it: a loop that never blocks on its results runs
ahead on p0 as it would unrecorded, while ``%jaxsys where`` still names p1's host delay at
every step (each step late by one delay, not a lateness that grows)."""

from __future__ import annotations

import re

from ..harness import kernel_with_cluster
from .test_stragglers_live import START

SETUP = """\
%%multihost
import time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("x",))
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("x")), np.ones((64, 4), np.float32)
)
# An all-gather and an all-reduce: the call returns before the collectives end.
step = jax.jit(lambda v: jnp.sum(v @ v.T))
print("compiled", float(step(x)))
"""

# No block_until_ready and no float() inside the loop: only the recorder waits.
LOOP = """\
%%multihost --timeout 120
t0 = time.perf_counter()
for _ in range(5):
    y = step(x)
print(f"loop {time.perf_counter() - t0:.2f} s")
"""


def test_a_loop_that_never_blocks_runs_ahead_and_the_late_process_is_named_at_each_step(tag):
    with kernel_with_cluster(tag, START) as k:
        k.ok(SETUP, timeout=120)
        k.ok("%jaxsys slow 1 --ms 200")
        try:
            out = k.ok(LOOP).stdout
        finally:
            k.ok("%jaxsys slow 1 --off")
        loops = {int(p): float(s) for p, s in re.findall(r"\[p(\d)\] loop ([\d.]+) s", out)}
        # p1 sleeps 200 ms before each of its five calls; p0's calls only queue the work
        # (its devices wait for p1 inside each step), so its loop does not wait for p1.
        assert loops[1] >= 0.9 and loops[0] < 0.5, out
        (bundle,) = k.ok("%jaxsys where").displays
        view = bundle["text/plain"]
        assert "jaxsys: p1 held the others up, in host (5 steps)" in view, view
        late = [float(m) for m in re.findall(r"p1 arrived last, late by ([\d.]+) ms", view)]
        # Each step's lateness is one delay, not the sum of the delays so far.
        assert len(late) == 5 and all(150 < ms < 400 for ms in late), view
