"""The divergence check on a real 4-process cluster: each way of running a different
program is named within 2 s of the diverging dispatch, and a stuck process is told apart."""

from __future__ import annotations

import re
import time

import pytest

from jaxsys_kernel import Cluster
from jaxsys_kernel import cells as executor

# Seconds from the diverging dispatch to the sentence under the cell.
WITHIN = 2.0

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


class Capture(executor.Sink):
    """Keeps the output, and when each stderr piece arrived (wall clock)."""

    def __init__(self):
        super().__init__()
        self.out: list[str] = []
        self.err: list[tuple[float, str]] = []

    def stdout(self, text):
        self.out.append(text)

    def stderr(self, text):
        self.err.append((time.time(), text))

    def finding(self) -> tuple[float, str]:
        found = [
            (t, s)
            for t, s in self.err
            if s.startswith("jaxsys: ") and (" ran " in s or "stuck" in s)
        ]
        assert found, f"no divergence sentence in {self.err!r}; stdout {self.out!r}"
        return found[0]

    def dispatched_at(self) -> float:
        times = [float(m) for m in re.findall(r"T0=([0-9.]+)", "".join(self.out))]
        assert times, f"the cell printed no T0: {self.out!r}"
        return min(times)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(hosts=4, devices_per_host=1, progress=lambda e: None)
    c.start_sync()
    yield c
    c.kill()


def run(cluster, code, *, timeout=None, grace=3.0):
    sink = Capture()
    cells_run = executor.execute(
        cluster,
        SETUP + code,
        sink=sink,
        timeout=timeout,
        grace=grace,
        on_hang=lambda _run: "restart",
        hooks={"divergence": {}},
        known=set(),
    )
    if cells_run.hang_action == "restart":
        cluster.restart_sync()
    return cells_run, sink


def first_line(code: str, text: str) -> int:
    """The line of ``text`` in the cell as the user wrote it."""
    lines = (SETUP + code).splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def timely(sink: Capture) -> str:
    at, sentence = sink.finding()
    took = at - sink.dispatched_at()
    print(f"named {took:.2f} s after the diverging dispatch: {sentence.strip()}")
    assert took < WITHIN, (took, sentence)
    return sentence


def test_the_silent_wrong_sum_of_the_issue_is_named(cluster):
    code = """\
x = global_rows(3 if me == 1 else 2)
print("T0=%f" % time.time())
total = jax.jit(jnp.sum)(x)
print(float(total))
"""
    r, sink = run(cluster, code, timeout=20)
    sentence = timely(sink)
    line = first_line(code, "jax.jit(jnp.sum)")
    assert (
        f"p1 ran sum(f32[12,4]) at line {line} where p0,2-3 ran sum(f32[8,4]) at line {line}"
        in sentence
    )
    assert sentence.rstrip().endswith(
        ("the result is not what either computed", "these processes will wait for each other")
    )


def test_a_different_function_on_one_process(cluster):
    code = """\
def total_a(v):
    return jnp.sum(v * 2)
def total_b(v):
    return jnp.sum(v * 3) + 1
x = global_rows(2)
print("T0=%f" % time.time())
y = jax.jit(total_b if me == 3 else total_a)(x)
"""
    r, sink = run(cluster, code, timeout=15)
    sentence = timely(sink)
    assert "p3 ran total_b(f32[8,4])" in sentence and "p0-2 ran total_a(f32[8,4])" in sentence


def test_one_process_skipping_a_collective(cluster):
    code = """\
def skipped_sum(v):
    return jnp.sum(v)
x = global_rows(2)
print("T0=%f" % time.time())
if jax.process_index() != 2:
    y = jax.jit(skipped_sum)(x)
"""
    r, sink = run(cluster, code, timeout=15)
    sentence = timely(sink)
    line = first_line(code, "jax.jit(skipped_sum)")
    assert sentence.startswith(
        f"jaxsys: p2 finished the cell without running skipped_sum(f32[8,4]) that p0-1,3 ran "
        f"at line {line}: p0-1,3 will wait for p2"
    ), sentence


def test_two_collectives_in_another_order(cluster):
    code = """\
def first_sum(v):
    return jnp.sum(v)
def then_max(v):
    return jnp.max(v)
x = global_rows(2)
print("T0=%f" % time.time())
order = (then_max, first_sum) if me == 2 else (first_sum, then_max)
for fn in order:
    jax.jit(fn)(x)
"""
    r, sink = run(cluster, code, timeout=15)
    sentence = timely(sink)
    assert "p2 ran then_max(f32[8,4])" in sentence and "p0-1,3 ran first_sum(f32[8,4])" in sentence


def test_a_process_asleep_in_python_is_stuck_not_diverged(cluster):
    code = """\
def waited_for(v):
    return jnp.sum(v)
x = global_rows(2)
if me == 1:
    time.sleep(30)
print("T0=%f" % time.time())
y = jax.jit(waited_for)(x)
"""
    r, sink = run(cluster, code, timeout=8)
    sentence = timely(sink)
    sleep = first_line(code, "time.sleep(30)")
    call = first_line(code, "jax.jit(waited_for)")
    assert sentence.strip() == (
        f"jaxsys: p1 sits idle in Python at line {sleep}, not in JAX, while p0,2-3 wait in "
        f"waited_for(f32[8,4]) at line {call}: p1 is stuck, not diverged"
    )


def test_the_same_program_everywhere_says_nothing(cluster):
    code = """\
def same_everywhere(v):
    return jnp.sum(v) * 2
x = global_rows(2)
for _ in range(3):
    print(float(jax.jit(same_everywhere)(x)))
"""
    r, sink = run(cluster, code, timeout=30)
    assert not r.failed(), r.results
    assert not any(s.startswith("jaxsys:") for _, s in sink.err), sink.err
    assert "".join(sink.out).count("64.0") >= 1


def test_the_thread_guard_rides_on_the_cells_own_request(cluster):
    code = """\
import threading
def from_a_thread(v):
    return jnp.sum(v)
x = global_rows(2)
worker = threading.Thread(target=lambda: jax.jit(from_a_thread)(x), name="side")
worker.start()
worker.join()
"""
    sink = Capture()
    r = executor.execute(
        cluster, SETUP + code, sink=sink, timeout=30, hooks={"thread_guard": {}, "divergence": {}}
    )
    for rank, p in r.results.items():
        assert p.error is not None and p.error["ename"] == "ThreadGuardError", (rank, p.error)
        assert "in thread 'side'" in p.error["evalue"]
    # The guard was for that cell only.
    r, sink = run(cluster, "print(float(jax.jit(lambda v: jnp.sum(v))(global_rows(2))))")
    assert not r.failed(), r.results
