"""Native output (fd 1 and fd 2) as whole lines: chatter to the log, the rest to the cell."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from jaxsys_kernel import contract
from jaxsys_kernel.engine import output

from ..unit.test_native_output import wait_for


def test_engine_modules_import_nothing_from_the_kernel_side():
    code = (
        "import sys\n"
        "import jaxsys_kernel.engine.bootstrap, jaxsys_kernel.engine.output\n"
        "import jaxsys_kernel.engine.agent, jaxsys_kernel.engine.native_log\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('jaxsys_kernel', 'jax')))))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    allowed = {"jaxsys_kernel", "jaxsys_kernel._version", "jaxsys_kernel.contract"}
    # The errors module sits in the bottom layer, beside the contract.
    allowed |= {"jaxsys_kernel.errors"}
    allowed |= {"jaxsys_kernel._compat", "jaxsys_kernel._compat.engine_kernel"}
    allowed |= {"jaxsys_kernel.telemetry", "jaxsys_kernel.telemetry.schema"}
    assert {m for m in loaded if not m.startswith("jaxsys_kernel.engine")} <= allowed
    assert "jax" not in loaded  # JAX is imported by the early-init thread, not by imports


# -- live: a 2 x 2 cluster ---------------------------------------------------------------------

GLOO_TEXT = re.compile(r"Gloo|Rank \d|connected to|peer ranks|Expected number")

FIRST_JIT = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
devices = sorted(jax.devices(), key=lambda d: d.id)
mesh = Mesh(np.array([devices[i] for i in {order}]), ("x",))
mine = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("x")), np.ones(len(mine), np.float32)
)
total = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, P()))(x)
print("sum", float(total.addressable_data(0)))
"""


@pytest.fixture(scope="module")
def live(tag):
    """A 2 x 2 cluster whose engines capture fd 1 and fd 2 as they do outside tests."""
    from jaxsys_kernel import Cluster

    # ipykernel leaves fd 1 and fd 2 alone in processes that see this variable.
    saved = os.environ.pop("PYTEST_CURRENT_TEST", None)
    try:
        cluster = Cluster(hosts=2, devices_per_host=2, progress=lambda e: None)
        cluster.start_sync()
    finally:
        if saved is not None:
            os.environ["PYTEST_CURRENT_TEST"] = saved
    yield cluster
    cluster.kill()


def run_cell(cluster, code: str, timeout: float = 120.0) -> tuple[dict, dict]:
    """Execute ``code`` on every process; its iopub messages and request ids, by rank."""
    import queue

    from jaxsys_kernel import _compat

    events: queue.SimpleQueue = queue.SimpleQueue()
    msg_ids: dict[int, str] = {}

    def hook(i, fut):
        msg_ids[i] = fut.msg_id
        fut.iopub_callbacks.append(lambda msg, i=i: events.put((i, msg)))
        fut.output.add_done_callback(lambda f, i=i: events.put((i, None)))

    ranks = list(cluster.ranks)
    _compat.send_execute(cluster.client, cluster.view, cluster.engine_ids(ranks), code, hook)
    messages: dict[int, list[dict]] = {r: [] for r in ranks}
    idle: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(idle) < len(ranks):
        i, msg = events.get(timeout=max(0.0, deadline - time.monotonic()))
        if msg is None:
            idle.add(ranks[i])
        else:
            messages[ranks[i]].append(msg)
    return messages, {ranks[i]: m for i, m in msg_ids.items()}


def streams(messages: list[dict], name: str) -> str:
    return "".join(
        m["content"]["text"]
        for m in messages
        if m["header"]["msg_type"] == "stream" and m["content"]["name"] == name
    )


def native(messages: list[dict]) -> list[tuple[dict, dict]]:
    """(payload, parent header) of every NATIVE_MIME display."""
    return [
        (m["content"]["data"][contract.NATIVE_MIME], m["parent_header"])
        for m in messages
        if m["header"]["msg_type"] == "display_data"
        and contract.NATIVE_MIME in m["content"]["data"]
    ]


def log_tails(cluster) -> dict[int, str]:
    return {
        r: cluster.client[cluster.engine_ids([r])[0]].apply_sync(output.log_tail)
        for r in cluster.ranks
    }


def test_first_collectives_never_leak_gloo_into_cell_output(live):
    # Each device order is a new gloo communicator, so each cell is a first collective
    # that prints gloo's connection message, from two threads at once for the full set.
    orders = [[0, 2], [1, 3], [0, 3], [1, 2], [0, 1, 2, 3]]
    for n, order in enumerate(orders, start=1):
        messages, _ = run_cell(live, FIRST_JIT.format(order=order))
        for rank, msgs in messages.items():
            assert not [m for m in msgs if m["header"]["msg_type"] == "error"], msgs
            assert streams(msgs, "stdout") == f"sum {float(len(order))}\n", (order, rank)
            assert streams(msgs, "stderr") == ""
            assert not [p for p, _ in native(msgs) if GLOO_TEXT.search(p["text"])]

        def logged_everywhere(n=n):
            tails = log_tails(live)
            return all(t.count("[Gloo] Rank") >= n for t in tails.values())

        wait_for(logged_everywhere, timeout=10)


def test_a_native_line_reaches_its_cell_as_a_native_display(live):
    code = (
        "import os, sys\n"
        "print('from python')\n"
        "os.write(1, b'native hello\\n')\n"
        "os.write(2, b'native complaint\\n')\n"
    )
    messages, msg_ids = run_cell(live, code)
    for rank, msgs in messages.items():
        assert streams(msgs, "stdout") == "from python\n"
        shown = native(msgs)
        assert [p for p, _ in shown] == [
            {"name": "stdout", "text": "native hello\n"},
            {"name": "stderr", "text": "native complaint\n"},
        ]
        assert all(parent["msg_id"] == msg_ids[rank] for _, parent in shown)
    for rank, tail in log_tails(live).items():
        assert "native hello\n" in tail and "native complaint\n" in tail
        # Python's print goes to ipykernel's stream, never through fd 1.
        assert "from python" not in tail
        path = live.client[live.engine_ids([rank])[0]].apply_sync(output.log_path)
        assert os.path.basename(path).startswith(f"native-p{rank}-")


def test_engines_capture_fds_as_outside_tests(live):
    # The fixture's point: ipykernel's own fd capture is on, with our pipes in front of it.
    def capture_state():
        import sys

        from jaxsys_kernel.engine.state import STATE

        return bool(getattr(sys.stdout, "_should_watch", False)), STATE.output.reader.alive

    for rank in live.ranks:
        assert live.client[live.engine_ids([rank])[0]].apply_sync(capture_state) == (True, True)
