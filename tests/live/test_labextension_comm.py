"""The ``jaxsys`` comm behind the JupyterLab extension, driven over the Jupyter protocol by a
real kernel with a real 2-process cluster: state pushes, and commands that work while a cell
blocks the shell."""

from __future__ import annotations

import time
import uuid

import pytest

from jaxsys_kernel.kernel import comm as jcomm

from ..harness import Kernel

pytestmark = pytest.mark.slow


class CommClient:
    """The front end's side of one ``jaxsys`` comm, over a jupyter_client connection."""

    def __init__(self, kernel: Kernel):
        self.k = kernel
        self.comm_id = uuid.uuid4().hex
        self.states: list[dict] = []
        self.replies: list[dict] = []
        self.other: list[dict] = []
        self._send("comm_open", {"target_name": jcomm.TARGET, "data": {}})

    def _send(self, msg_type: str, content: dict) -> None:
        content = {"comm_id": self.comm_id, **content}
        self.k.kc.shell_channel.send(self.k.kc.session.msg(msg_type, content))

    def command(self, action: str, rank: int | None = None) -> str:
        request = uuid.uuid4().hex[:8]
        data = {"type": "command", "action": action, "rank": rank, "id": request}
        self._send("comm_msg", {"data": data})
        return request

    def poll(self, timeout: float) -> None:
        """Read iopub messages for up to ``timeout`` seconds (at least one, if any come)."""
        try:
            msg = self.k.kc.get_iopub_msg(timeout=timeout)
        except Exception:  # noqa: BLE001 - queue.Empty: nothing arrived
            return
        content = msg["content"]
        if msg["msg_type"] == "comm_msg" and content.get("comm_id") == self.comm_id:
            data = content["data"]
            if data.get("type") == "state":
                assert data["v"] == jcomm.SCHEMA_VERSION
                self.states.append(data["state"])
            elif data.get("type") == "reply":
                self.replies.append(data)
        else:
            self.other.append(msg)

    def wait_state(self, pred, timeout: float = 30.0, what: str = "") -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.states and pred(self.states[-1]):
                return self.states[-1]
            self.poll(min(0.5, max(0.01, deadline - time.monotonic())))
        raise AssertionError(f"no state {what} in {timeout} s; last: {self.states[-1:]}")

    def wait_reply(self, request: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for r in self.replies:
                if r["id"] == request:
                    return r
            self.poll(min(0.5, max(0.01, deadline - time.monotonic())))
        raise AssertionError(f"no reply to {request} in {timeout} s")

    def cell_idle(self, msg_id: str) -> bool:
        return any(
            m["msg_type"] == "status"
            and m["parent_header"].get("msg_id") == msg_id
            and m["content"]["execution_state"] == "idle"
            for m in self.other
        )


def said(reply: dict) -> str:
    """A reply in full on one line, for assertion messages (pytest shortens dicts)."""
    return f"ok={reply.get('ok')} message={reply.get('message')!r} log={reply.get('log')}"


@pytest.fixture(scope="module")
def k(tag):
    kernel = Kernel(tag)
    try:
        yield kernel
    finally:
        kernel.shutdown()


@pytest.fixture(scope="module")
def client(k):
    return CommClient(k)


def _cluster(state):
    return state["cluster"]


def test_open_sends_the_state_without_a_cluster(k, client):
    state = client.wait_state(lambda s: True, what="at all")
    assert state["cluster"] is None
    assert state["kernel"]["pid"] == k.pid
    assert state["cell_running"] is False


def test_a_bad_command_is_refused_with_the_reason(client):
    request = client.command("explode")
    reply = client.wait_reply(request, timeout=10)
    assert reply["ok"] is False and "unknown action 'explode'" in reply["message"]
    request = client.command("kill")
    reply = client.wait_reply(request, timeout=10)
    assert reply["ok"] is False and "kill needs a process" in reply["message"]


def test_commands_without_a_cluster_say_so(client):
    reply = client.wait_reply(client.command("stacks"), timeout=10)
    assert reply["ok"] is False and reply["message"] == "no cluster is running"


def test_start_from_the_comm_then_the_state_follows(k, client):
    # The sidebar's start uses the kernelspec's defaults; the test's environment sets a
    # small cluster.
    k.ok("import os; os.environ.update(JAXSYS_HOSTS='2', JAXSYS_DEVICES_PER_HOST='1')")
    t0 = time.monotonic()
    reply = client.wait_reply(client.command("start"), timeout=180)
    assert reply["ok"], said(reply)
    assert reply["message"].startswith("2 processes ready in")
    state = client.wait_state(
        lambda s: _cluster(s) and _cluster(s)["alive"] == 2, timeout=30, what="2 alive"
    )
    c = state["cluster"]
    assert (c["nprocs"], c["devices"], c["live_devices"], c["warning"]) == (2, 2, 2, False)
    assert [p["rank"] for p in c["processes"]] == [0, 1]
    assert all(p["heartbeat_age"] is not None and p["heartbeat_age"] < 5 for p in c["processes"])
    assert c["security"].startswith("mTLS on the coordination service"), c["security"]
    assert c["cache"] is not None and "hit_rate" in c["cache"]
    print(f"comm start -> 2/2 alive: {time.monotonic() - t0:.1f} s")


def test_state_is_pushed_while_a_cell_blocks_and_commands_run(k, client):
    cell = k.kc.execute("%%multihost --procs 0\nimport time\ntime.sleep(60)")
    client.wait_state(lambda s: s["cell_running"], timeout=10, what="cell running")
    t0 = time.monotonic()
    reply = client.wait_reply(client.command("kill", 1), timeout=20)
    took = time.monotonic() - t0
    assert reply["ok"] and reply["message"].startswith("p1 killed"), said(reply)
    state = client.wait_state(lambda s: _cluster(s)["warning"], timeout=5, what="warning")
    assert _cluster(state)["alive"] == 1
    assert [p["state"] for p in _cluster(state)["processes"]] == ["alive", "dead"]
    assert not client.cell_idle(cell), "the kill waited for the cell"

    reply = client.wait_reply(client.command("restart", 1), timeout=120)
    assert reply["ok"] and "p1 rejoined" in reply["message"], said(reply)
    client.wait_state(
        lambda s: _cluster(s)["alive"] == 2 and not _cluster(s)["warning"], timeout=20, what="2/2"
    )
    reply = client.wait_reply(client.command("stacks", 0), timeout=20)
    assert reply["ok"] and reply["message"].startswith("stacks of p0"), said(reply)
    # The innermost frame of process 0: the cell's line 2, the sleep.
    assert any(" p0 " in line and "line 2" in line for line in reply["log"]), reply["log"]
    print("stacks:", reply["log"])
    assert not client.cell_idle(cell)
    print(f"kill from the comm while a cell blocks: reply after {took:.2f} s")

    # Stopping the cluster ends the blocked cell first.
    t0 = time.monotonic()
    reply = client.wait_reply(client.command("stop-cluster"), timeout=60)
    assert reply["ok"] and reply["message"].startswith("cluster stopped"), said(reply)
    assert reply["log"] == ["interrupted the running cell"]
    state = client.wait_state(lambda s: s["cluster"] is None, timeout=10, what="no cluster")
    deadline = time.monotonic() + 10
    while not client.cell_idle(cell) and time.monotonic() < deadline:
        client.poll(0.5)
    assert client.cell_idle(cell)
    assert k._shell_reply(cell)["content"]["status"] == "error"
    print(f"stop-cluster with a blocked cell: {time.monotonic() - t0:.1f} s")
