"""The barrier, multihost_utils, the thread guard and transfers between processes, live.

One 2-process cluster for the module, started with a transfer socket per process.
"""

from __future__ import annotations

import time

import pytest

from jaxsys_kernel import Cluster, contract
from jaxsys_kernel import cells as executor
from jaxsys_kernel.magics import actions_guard


class Capture(executor.Sink):
    def __init__(self):
        super().__init__()
        self.out: list[str] = []

    def stdout(self, text):
        self.out.append(text)

    stderr = stdout


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(
        hosts=2, devices_per_host=2, env={contract.TRANSFER_PORTS: "1"}, progress=lambda e: None
    )
    c.start_sync()
    yield c
    c.kill()


def run(cluster, code):
    sink = Capture()
    r = executor.execute(cluster, code, sink=sink)
    return r, "".join(sink.out)


def ok(cluster, code) -> str:
    r, out = run(cluster, code)
    errors = {k: p.error["evalue"] for k, p in r.results.items() if p.error}
    assert not errors, errors
    return out


def test_barrier_passes_when_everyone_arrives(cluster):
    lines = []
    outcome = actions_guard.run_barrier(cluster, "all-here", 20.0, on_progress=lines.append)
    assert outcome["arrived"] == [0, 1] and outcome["missing"] == []
    assert set(outcome["waited"]) == {0, 1}


def test_barrier_names_a_process_held_back(cluster):
    # Process 1 is busy with an earlier request for longer than the barrier waits.
    held = cluster.client[cluster.processes[1].engine_id].apply_async(time.sleep, 6.0)
    lines: list[str] = []
    t0 = time.monotonic()
    outcome = actions_guard.run_barrier(cluster, "held", 2.0, on_progress=lines.append)
    took = time.monotonic() - t0
    assert outcome["missing"] == [1] and outcome["arrived"] == [0], outcome
    assert outcome["busy"] == [1]
    assert "p1 never arrived" in outcome["errors"][0]
    assert "[p0] waiting at barrier 'held': arrived p0; missing p1" in lines, lines
    assert took < 2.0 + actions_guard.BARRIER_SLACK
    message = actions_guard.barrier_failure("held", 2.0, outcome)
    assert message.startswith("barrier 'held' timed out after 2 s: p1 never arrived (arrived: p0)")
    held.get(timeout=30)
    # The withdrawn arrival never runs: the next barrier passes on both processes.
    again = actions_guard.run_barrier(cluster, "after", 20.0, on_progress=lambda _l: None)
    assert again["arrived"] == [0, 1], again


SETUP = """
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import multihost_utils as mu
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
pid, n = jax.process_index(), jax.process_count()
"""


def test_multihost_utils_helpers(cluster):
    ok(cluster, SETUP)
    out = ok(cluster, "mu.sync_global_devices('t'); print('synced', pid)")
    assert "[p0] synced 0" in out and "[p1] synced 1" in out
    out = ok(cluster, "print('bcast', mu.broadcast_one_to_all(np.array([pid + 10, 7])).tolist())")
    assert "bcast [10, 7]" in out and "[p1]" not in out  # identical on both: collated
    out = ok(
        cluster,
        "g = mu.process_allgather(np.full((3,), pid, np.int32))\nprint('gather', g.shape, g.tolist())",
    )
    assert "gather (2, 3) [[0, 0, 0], [1, 1, 1]]" in out
    ok(cluster, "mu.assert_equal(np.arange(4), 'same everywhere')")
    r, _ = run(cluster, "mu.assert_equal(np.array([pid]), 'differs')")
    assert {k for k, p in r.results.items() if p.error} == {0, 1}
    assert all("differs" in p.error["evalue"] for p in r.results.values())
    out = ok(
        cluster,
        "mesh = Mesh(np.array(jax.devices()), ('x',))\n"
        "local = np.arange(4.0).reshape(2, 2) + 10 * pid\n"
        "g = mu.host_local_array_to_global_array(local, mesh, P('x'))\n"
        "back = mu.global_array_to_host_local_array(g, mesh, P('x'))\n"
        "print('global', g.shape, float(jnp.sum(g)), np.array_equal(np.asarray(back), local))",
    )
    # Process 0 holds 0..3, process 1 holds 10..13: 6 + 46.
    assert "global (4, 2) 52.0 True" in out, out


PUT = """
d0 = [d for d in jax.devices() if d.process_index == 0][0]
d1 = [d for d in jax.devices() if d.process_index == 1][0]
src = NamedSharding(Mesh(np.array([d0]), ("x",)), P())
dst = NamedSharding(Mesh(np.array([d1]), ("x",)), P())
data = np.arange(12, dtype=np.float32).reshape(3, 4) * 1.5
x = jax.make_array_from_callback(data.shape, src, lambda i: data[i], dtype=np.float32)
y = jax.device_put(x, dst)
if pid == 1:
    got = np.asarray(y.addressable_data(0))
    print("received", got.shape, np.array_equal(got, data), float(got.sum()))
mu.sync_global_devices("after-put")
"""


def test_device_put_moves_the_values_to_the_other_process(cluster):
    ok(cluster, SETUP)
    out = ok(
        cluster,
        "from jax._src import xla_bridge as xb\nprint(xb.CROSS_HOST_TRANSFER_SOCKET_ADDRESS.value)",
    )
    addresses = [line.split("] ", 1)[1] for line in out.splitlines() if line.startswith("[p")]
    assert len(set(addresses)) == 2 and all(a.startswith("127.0.0.1:") for a in addresses), out
    assert all(not a.endswith(":0") for a in addresses)
    # The security audit lists each process's transfer socket, as JAX set it.
    from jaxsys_kernel.cluster.audit import audit

    listed = {e.address for e in audit(cluster) if e.name == "JAX cross-host transfers"}
    assert listed == set(addresses), (listed, addresses)
    out = ok(cluster, PUT)
    assert "[p1] received (3, 4) True 99.0" in out, out


THREADED = """
import threading
mesh = Mesh(np.array(jax.devices()), ("x",))
xs = jax.device_put(np.arange(4.0), NamedSharding(mesh, P("x")))
total = jax.jit(lambda a: a.sum())
worker = threading.Thread(target=lambda: total(xs), name="stage-2")
worker.start()
worker.join()
print("joined")
"""


def test_thread_guard_names_both_threads_on_every_process(cluster):
    ok(cluster, SETUP)
    actions_guard.arm_thread_guard(cluster, cluster.ranks)
    r, _ = run(cluster, THREADED)
    for rank, p in r.results.items():
        assert p.error is not None, rank
        assert p.error["ename"] == "ThreadGuardError", p.error
        v = p.error["evalue"]
        assert f"on process {rank} in thread 'stage-2'" in v, v
        assert "'MainThread'" in v and "different orders" in v, v
    # Without the guard the same cell runs (each process runs the collective once).
    out = ok(cluster, THREADED)
    assert "[p0-1] joined" in out
