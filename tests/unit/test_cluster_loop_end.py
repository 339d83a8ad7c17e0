"""The private loop thread of an async-first object ends once nothing needs it
(cluster/loop.py): a kernel that starts cluster after cluster keeps no thread for each."""

from __future__ import annotations

import asyncio
import threading
import time

from jaxsys_kernel import Cluster
from jaxsys_kernel.cluster.loop import AsyncFirst


def _wait(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class _Worker(AsyncFirst):
    def __init__(self):
        super().__init__(progress=lambda e: None)
        self.release: asyncio.Event | None = None
        self.running = threading.Event()
        self.ended = 0

    async def where(self) -> threading.Thread:
        """Say which thread ran the work."""
        return threading.current_thread()

    async def hold(self) -> None:
        """Run until released."""
        self.release = asyncio.Event()
        self.running.set()
        await self.release.wait()

    def _loop_ended(self) -> None:
        self.ended += 1


def test_an_idle_loop_ends_when_asked_and_a_later_call_makes_a_new_one():
    w = _Worker()
    first = w.where_sync()
    assert first.is_alive()
    w._end_loop_when_idle()
    assert _wait(lambda: not first.is_alive()), "the idle loop's thread did not end"
    assert w.ended == 1 and w._loop is None
    second = w.where_sync()
    assert second is not first and second.is_alive()
    w._end_loop_when_idle()
    assert _wait(lambda: not second.is_alive())


def test_a_loop_with_work_under_way_is_kept():
    w = _Worker()
    done = threading.Thread(target=w.hold_sync)
    done.start()
    assert w.running.wait(10)
    thread = w._loop_thread
    w._end_loop_when_idle()
    # The request was looked at on the loop (a call after it runs after it) and refused.
    assert w.where_sync() is thread and thread.is_alive() and w.ended == 0
    w._loop.call_soon_threadsafe(w.release.set)
    done.join(10)
    assert not done.is_alive()
    w._end_loop_when_idle()
    assert _wait(lambda: not thread.is_alive())


def test_work_handed_over_while_the_loop_decides_is_never_lost():
    # Calls from other threads race with the requests to end: each call still returns.
    w = _Worker()
    results: list[threading.Thread] = []
    errors: list[BaseException] = []

    def calls():
        try:
            for _ in range(50):
                results.append(w.where_sync())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    callers = [threading.Thread(target=calls) for _ in range(3)]
    for c in callers:
        c.start()
    for _ in range(200):
        w._end_loop_when_idle()
        time.sleep(0.001)
    for c in callers:
        c.join(30)
    assert not any(c.is_alive() for c in callers), "a call waited on a loop that had ended"
    assert not errors and len(results) == 150
    w._end_loop_when_idle()
    assert _wait(lambda: not any(t.is_alive() for t in set(results)))


async def _current_thread() -> threading.Thread:
    return threading.current_thread()


def test_a_stopped_cluster_keeps_no_loop_thread():
    c = Cluster(hosts=1, progress=lambda e: None)
    # A call on a cluster that is not running: its loop is made, then ends with the call.
    thread = c._run_sync(_current_thread())
    assert thread.name == "jaxsys-cluster-loop"
    assert _wait(lambda: not thread.is_alive()), "the stopped cluster kept its loop"
    assert c.state == "stopped"
