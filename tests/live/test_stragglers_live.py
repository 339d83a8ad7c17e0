"""``%jaxsys where`` and ``%jaxsys slow`` through a real kernel and a 2-process cluster.

Each training-like cell runs a few steps of a jitted sum over an array spread over both
processes; the collective inside makes the early process wait for the late one.
"""

from __future__ import annotations

import re

import pytest

from ..harness import kernel_with_cluster

START = "%jaxsys start --hosts 2 --devices-per-host 1"

SETUP = """\
%%multihost
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("x",))
rows = NamedSharding(mesh, P("x"))
x = jax.make_array_from_process_local_data(rows, np.ones((4, 8), np.float32))
step = jax.jit(lambda v: jnp.sum(v * 2))
"""

STEPS = """\
%%multihost --timeout 120
for i in range(5):
    y = step(x)
print("total", float(y))
"""


def shown(kernel) -> str:
    """The text of ``%jaxsys where``, checking that its picture came with it."""
    out = kernel.ok("%jaxsys where")
    (bundle,) = out.displays
    assert bundle["image/svg+xml"].startswith("<svg") and "p0" in bundle["image/svg+xml"]
    return bundle["text/plain"]


@pytest.fixture(scope="module")
def k(tag):
    with kernel_with_cluster(tag, START) as kernel:
        kernel.ok(SETUP, timeout=120)
        said = kernel.ok("%jaxsys where on").stdout
        assert "recorded on on processes [0, 1]" in said, said
        kernel.ok(STEPS)  # compiles the step once, before the measured cells
        yield kernel


def test_an_undisturbed_run_names_no_one(k):
    assert "total 128.0" in k.ok(STEPS).stdout
    view = shown(k)
    assert "no process held the others up beyond the noise (5 steps)" in view, view
    assert "p0" in view and "p1" in view


@pytest.mark.parametrize("where", ["host", "input", "compute"])
def test_a_200_ms_delay_on_p1_is_named_with_its_category_within_5_steps(k, where):
    said = k.ok(f"%jaxsys slow 1 --ms 200 --in {where}").stdout
    assert f"p1: 200 ms in {where} before each step" in said, said
    try:
        assert "total 128.0" in k.ok(STEPS).stdout
    finally:
        assert "p1: no delay" in k.ok("%jaxsys slow 1 --off").stdout
    view = shown(k)
    assert f"jaxsys: p1 held the others up, in {where} (5 steps)" in view, view
    # The delay is 200 ms; what is measured of it, after the clocks' offset, may be a little
    # less (198.7 ms was seen), never far off.
    late = [float(x) for x in re.findall(r"p1 arrived last, late by ([0-9.]+) ms", view)]
    assert late and all(150.0 <= ms <= 400.0 for ms in late), view


def test_slow_refuses_a_process_not_in_the_cluster_and_a_missing_ms(k):
    err = k.execute("%jaxsys slow 7 --ms 200")
    assert "no process 7" in err.stderr, err.stderr
    err = k.execute("%jaxsys slow 1")
    assert "needs --ms N or --off" in err.stderr, err.stderr
