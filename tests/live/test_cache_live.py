"""Artifacts that outlive processes, on a real 2-process cluster (one cluster for the module).

An export with a symbolic batch is made, shown as a card and saved; the world restarts; every
process loads it and calls it with three batch sizes and once outside its constraint. The
training step compiled before the restart is served from the cache afterwards, counted
exactly per process: process 0 hits every request, process 1 (on CPU) is told why not.
"""

from __future__ import annotations

import argparse
import time

import pytest

from jaxsys_kernel import Cluster
from jaxsys_kernel import cells as executor
from jaxsys_kernel.magics import actions_cache
from jaxsys_kernel.magics.session import MultihostSession


class Capture(executor.Sink):
    def __init__(self):
        super().__init__()
        self.out: list[str] = []
        self.summaries: list[dict] = []

    def stdout(self, text):
        self.out.append(text)

    stderr = stdout

    def view(self, summary):
        self.summaries.append(summary)


@pytest.fixture(scope="module")
def world(tag, tmp_path_factory):
    cache = tmp_path_factory.mktemp("jax-cache")
    c = Cluster(hosts=2, devices_per_host=2, cache_dir=str(cache), progress=lambda e: None)
    c.start_sync()
    session = MultihostSession()
    session.cluster = c
    yield {"cluster": c, "session": session, "dir": cache, "files": tmp_path_factory.mktemp("x")}
    c.kill()


def run(cluster, code) -> Capture:
    sink = Capture()
    r = executor.execute(cluster, code, sink=sink)
    errors = [p.error["evalue"] for p in r.results.values() if p.error]
    assert not errors, errors[0]
    executor.raise_for_run(r)
    executor.cell_result(r, sink)
    return sink


def settled(cluster, since: float, timeout: float = 15.0) -> list:
    """Cache numbers once every process has sent a heartbeat after ``since``.

    Each agent sends its events in order on one socket, so a heartbeat sent after a cell
    ended comes after every compile event of that cell.
    """
    hub = cluster.telemetry
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = {e["rank"] for e in list(hub.recent) if e["kind"] == "heartbeat" and e["t"] > since}
        if seen >= set(cluster.ranks):
            return {s.rank: s for s in hub.cache_stats()}
        time.sleep(0.05)
    raise AssertionError(f"no heartbeat after the cell from every process within {timeout} s")


def action(session, capsys, what="show", **options):
    args = argparse.Namespace(
        what=what, min_compile_secs=None, min_entry_bytes=None, proc=None, limit=10
    )
    vars(args).update(options)
    view = actions_cache.cache(session, args)
    return capsys.readouterr().out, view


TRAIN = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
rows = NamedSharding(mesh, P("x", None))

def loss(w, x):
    h = x
    for _ in range(12):
        h = jnp.tanh(h @ w)
    return jnp.mean(h ** 2)

@jax.jit
def train_step(w, x):
    return w - 0.1 * jax.grad(loss)(w, x)

data = np.linspace(-1, 1, 32 * 16, dtype=np.float32).reshape(32, 16)
x = jax.make_array_from_callback(data.shape, rows, lambda idx: data[idx])
w = train_step(jnp.eye(16, dtype=jnp.float32) * 0.5, x)
print("trained:", round(float(np.asarray(w.addressable_data(0)).sum()), 4))
"""

EXPORT = """
import jaxsys_kernel
from jax import export
b, = export.symbolic_shape("b", constraints=("b <= 16",))

def predict(x, w):
    return jnp.tanh(x @ w)

exp = export.export(jax.jit(predict))(
    jax.ShapeDtypeStruct((4 * b, 4), jnp.float32, sharding=rows),
    jax.ShapeDtypeStruct((4, 3), jnp.float32),
)
print("saved bytes:", jaxsys_kernel.save_exported(exp, {path!r}))
exp
"""

LOAD = """
import jax, jax.numpy as jnp, numpy as np, jaxsys_kernel
from jax.sharding import NamedSharding, PartitionSpec as P
rows = NamedSharding(jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,)), P("x", None))
f = jaxsys_kernel.load_exported({path!r})
w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
for n in (4, 8, 12):
    data = np.linspace(-1, 1, n * 4, dtype=np.float32).reshape(n, 4)
    y = f(jax.make_array_from_callback(data.shape, rows, lambda idx: data[idx]), w)
    mine = all(np.allclose(np.asarray(s.data), np.tanh(data @ w)[s.index], atol=1e-6)
               for s in y.addressable_shards)
    print(f"p{{jax.process_index()}} batch {{n}}: {{y.shape}} {{mine}}")
try:
    data = np.ones((68, 4), np.float32)
    f(jax.make_array_from_callback(data.shape, rows, lambda idx: data[idx]), w)
except jaxsys_kernel.export.ExportCallError as e:
    print("refused:", e)
"""


def test_thresholds_are_set_on_every_process_and_shown(world, capsys):
    out, view = action(world["session"], capsys, min_compile_secs=0.0, min_entry_bytes=-1)
    stats = world["cluster"].telemetry.cache_stats()
    assert [(s.min_compile_secs, s.min_entry_bytes) for s in stats] == [(0.0, -1), (0.0, -1)]
    assert (
        "[p0-1] an entry is written when its compile took at least 0 s and it has any size" in out
    )
    assert f"cache: {world['dir']}" in out
    assert [row["min_compile_secs"] for row in view.stats] == [0.0, 0.0]
    # Restarted processes keep them: JAX reads its own variables at start-up.
    assert world["cluster"].env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"


def test_thresholds_shown_are_the_ones_a_cell_set_itself(world, capsys):
    # A user may set JAX's option in a cell, not through %jaxsys cache: the view must say
    # what each process holds now, not what it reported at start.
    run(world["cluster"], "import jax\njax.config.update('jax_persistent_cache_min_compile_time_secs', 2.5)")
    try:
        out, _ = action(world["session"], capsys)
        assert "[p0-1] an entry is written when its compile took at least 2.5 s" in out, out
    finally:
        action(world["session"], capsys, min_compile_secs=0.0)


def test_export_card_then_save(world):
    path = str(world["files"] / "predict.jaxexport")
    run(world["cluster"], TRAIN)
    sink = run(world["cluster"], EXPORT.format(path=path))
    (card,) = sink.summaries
    assert card["kind"] == "export" and card["fun_name"] == "predict"
    assert [i["type"] for i in card["inputs"]] == ["f32[4*b, 4]", "f32[4, 3]"]
    assert card["constraints"] == ["b >= 1", "b <= 16"]
    assert card["nr_devices"] == 4 and card["devices_here"] == 4 and card["mesh"] == "x=4"
    assert card["loads_here"] and card["runs_here"]
    assert "".join(sink.out).count("saved bytes:") == 1  # identical on both: collated


def test_cache_hits_after_a_world_restart_are_counted_per_process(world, capsys):
    cluster = world["cluster"]
    cluster.restart_sync()
    out = "".join(run(cluster, TRAIN).out)
    assert "trained:" in out
    stats = settled(cluster, time.time())
    p0, p1 = stats[0], stats[1]
    # Every program the cell compiled was written by process 0 before the restart.
    assert p0.requests >= 2 and p0.hits == p0.requests and p0.compiles == 0
    assert p0.served and p0.time_saved > 0 and p0.unmeasured_hits == 0
    # Process 1 asks for the same programs under keys of its own, and compiles them all.
    assert p1.requests == p0.requests and p1.hits == 0 and p1.compiles == p1.requests
    assert p1.served is False and "only process 0 writes entries" in p1.why_not
    assert p1.last_misses and "not served by the cache: on CPU" in p1.last_misses[-1]
    text, view = action(world["session"], capsys)
    assert "p0: served." in text and f"{p0.requests} hit(s)" in text
    assert "p1: not served by the cache: on CPU" in text
    assert "jit_train_step" in text and "made by jaxlib" in text
    assert {row["rank"]: row["hits"] for row in view.stats} == {0: p0.requests, 1: 0}


def test_a_saved_export_loads_and_runs_everywhere_after_the_restart(world):
    path = str(world["files"] / "predict.jaxexport")
    out = "".join(run(world["cluster"], LOAD.format(path=path)).out)
    for p in (0, 1):
        for n in (4, 8, 12):
            assert f"p{p} batch {n}: ({n}, 3) True" in out, out
    assert (
        "refused: predict: b = 17 (from args[0].shape[0] = 68) breaks the constraint b <= 16" in out
    )


def test_misses_on_demand_then_clear_then_the_threshold_holds(world, capsys):
    session, cluster = world["session"], world["cluster"]
    out, _ = action(session, capsys, what="misses", proc="1")
    assert out.startswith("[p1] ") and "persistent" in out and "not served by the cache" in out
    out, _ = action(session, capsys, what="clear")
    assert "removed" in out and "0 entries" not in out
    out, _ = action(session, capsys)
    assert "entries: 0," in out
    action(session, capsys, min_compile_secs=600.0)
    since = time.time()
    run(
        cluster, "g = jax.jit(lambda v: jnp.cos(v) * 7 - 1)\ng(jnp.arange(5.0)).block_until_ready()"
    )
    # The cell's own compile, by its function: on a loaded machine an event of an earlier
    # cell's compile may still arrive after it.
    misses = [m for m in settled(cluster, since)[0].last_misses if "<lambda>" in m]
    assert misses, settled(cluster, since)[0].last_misses
    assert "not written: its compile took" in misses[-1], misses
    assert "below the 600 s minimum" in misses[-1], misses
    out, _ = action(session, capsys)
    assert "entries: 0," in out
