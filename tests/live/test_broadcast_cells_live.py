"""A cell sent as one broadcast through the controller's broadcast scheduler, live: output
by process, a subset of processes, errors, a hang interrupted, an engine that dies, and
nothing left in the client's books; the direct queue is held to the same checks.

One 2 x 1 cluster for the module.
"""

from __future__ import annotations

import time

import pytest

from jaxsys_kernel import Cluster
from jaxsys_kernel import cells as executor
from jaxsys_kernel.cells import send
from jaxsys_kernel.cluster.cluster import pid_alive

PATHS = {"broadcast": True, "direct": False}


class Capture(executor.Sink):
    def __init__(self):
        super().__init__()
        self.out: list[str] = []

    def stdout(self, text):
        self.out.append(text)

    stderr = stdout


@pytest.fixture(scope="module")
def cluster(tag):
    c = Cluster(hosts=2, devices_per_host=1, progress=lambda e: None)
    c.start_sync()
    yield c
    c.kill()


@pytest.fixture(params=list(PATHS))
def path(request, monkeypatch):
    monkeypatch.setattr(send, "BROADCAST", PATHS[request.param])
    return request.param


def run(cluster, code, **kw):
    sink = Capture()
    r = executor.execute(cluster, code, sink=sink, **kw)
    return r, "".join(sink.out)


def books(client) -> tuple[int, int, int]:
    """What the client still keeps about requests: outstanding ids, futures, output futures."""
    return len(client.outstanding), len(client._futures), len(client._output_futures)


def test_each_process_runs_the_cell_once_and_its_output_is_its_own(cluster, path):
    pids = [p.pid for p in cluster.processes]
    r, out = run(cluster, "import os\nprint('pid', os.getpid())\nos.getpid()", collate=False)
    assert r.by_status("ok") == [0, 1]
    # Uncollated lines come in the order they arrive.
    assert sorted(out.splitlines()) == [f"[p0] pid {pids[0]}", f"[p1] pid {pids[1]}"]
    assert [r.results[i].result["text/plain"] for i in (0, 1)] == [str(p) for p in pids]
    r, out = run(cluster, "print('same')")
    assert out == "[p0-1] same\n"
    assert books(cluster.client) == (0, 0, 0)


def test_engines_send_no_busy_or_input_notices_and_output_still_arrives(cluster):
    # Runs before any test of this module ends a process. The engines skip the status-busy
    # and execute_input messages nobody reads; a %%px-style request still gets its output,
    # its reply and its end (the idle status).
    ar = cluster.view.execute("print('seen')", silent=False)
    ar.get(timeout=30)
    ar.wait_for_output(timeout=30)
    assert [s.strip() for s in ar.stdout] == ["seen", "seen"]
    assert all(md["execute_input"] is None for md in ar._metadata)


def test_a_subset_of_processes_runs_alone(cluster, path):
    r, out = run(cluster, "import jax\nprint('only', jax.process_index())", procs=[1])
    assert r.procs == [1] and r.by_status("ok") == [1]
    assert out == "[p1] only 1\n"


def test_an_error_on_one_process_is_that_process_s(cluster, path):
    code = (
        "import jax\nif jax.process_index() == 1:\n    raise ValueError('p1 only')\nprint('fine')"
    )
    r, out = run(cluster, code)
    assert r.by_status("ok") == [0] and r.by_status("error") == [1]
    assert r.results[1].error["ename"] == "ValueError"
    assert r.results[1].error["evalue"] == "p1 only"
    assert out == "[p0] fine\n"
    assert books(cluster.client) == (0, 0, 0)


def test_a_hung_cell_is_interrupted_on_every_process(cluster, path):
    r, _ = run(cluster, "import time\ntime.sleep(120)", timeout=1.0)
    assert r.hang == "timeout" and r.hang_action == "interrupt" and r.interrupted == [0, 1]
    assert {r.results[i].error["ename"] for i in (0, 1)} == {"KeyboardInterrupt"}
    r, out = run(cluster, "print('after')")
    assert r.by_status("ok") == [0, 1] and out == "[p0-1] after\n"


def test_a_process_that_dies_during_a_broadcast_cell_is_reported_dead(cluster, monkeypatch):
    # Last in the module: process 1 does not come back.
    monkeypatch.setattr(send, "BROADCAST", True)
    victim = cluster.processes[1].pid
    code = (
        "import jax, os, signal, time\n"
        "if jax.process_index() == 1:\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "print('survived')"
    )
    r, out = run(cluster, code, timeout=60.0)
    assert r.by_status("ok") == [0] and r.by_status("dead") == [1], r.results
    assert out == "[p0] survived\n"
    # The cell learned of the death from the pid; the client's own books clear once the
    # hub drops the engine (its missed heartbeats, seconds later).
    deadline = time.monotonic() + 20
    while books(cluster.client) != (0, 0, 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert books(cluster.client) == (0, 0, 0)
    assert not pid_alive(victim)
