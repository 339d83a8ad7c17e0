"""A cell that arrives while another thread stops the cluster (the sidebar's Stop runs on the
control subshell) waits for the stop to end and starts a new cluster; it never takes the
processes being killed."""

from __future__ import annotations

import threading

from jaxsys_kernel import contract
from jaxsys_kernel.cluster import teardown
from jaxsys_kernel.kernel import comm
from jaxsys_kernel.magics import health
from jaxsys_kernel.magics.session import MultihostSession

from ..harness import wait_no_processes


def _wait(event: threading.Event, what: str, timeout: float = 60.0) -> None:
    assert event.wait(timeout), f"{what} not within {timeout:g} s"


def test_a_cell_during_a_stop_from_another_thread_waits_and_starts_a_new_cluster(tag, monkeypatch):
    monkeypatch.setenv(contract.HOSTS, "2")
    monkeypatch.setenv(contract.DEVICES_PER_HOST, "1")
    # The teardown is held at its start until the test lets it go, so that the cell surely
    # arrives while it runs: everything else is the real teardown of a real cluster.
    began, go = threading.Event(), threading.Event()
    real_kill = teardown.kill

    def held_kill(world):
        began.set()
        assert go.wait(60), "the test never let the teardown go"
        return real_kill(world)

    session = MultihostSession()
    old = session.start()
    monkeypatch.setattr(teardown, "kill", held_kill)
    stopper = threading.Thread(target=session.stop, daemon=True)
    got: dict = {}
    cell = threading.Thread(target=lambda: got.update(c=session.ensure_cluster()), daemon=True)
    try:
        stopper.start()
        _wait(began, "the teardown's start")
        # Every surface says it is gone while it is being torn down.
        assert old.state == "stopping"
        assert comm.cluster_state(session)["cluster"] is None
        assert health.health(old).state == health.STOPPED
        cell.start()
    finally:
        # Whatever failed above, the teardown goes on: nothing is left behind.
        go.set()
        stopper.join(60)
        monkeypatch.setattr(teardown, "kill", real_kill)
    try:
        cell.join(120)
        assert not stopper.is_alive() and not cell.is_alive()
        new = got["c"]
        assert new is not old, "the cell took the cluster being stopped"
        assert old.state == "stopped"
        assert new.state == "ready"
        assert new.view.apply_sync(lambda: 6 * 7) == [42, 42]
    finally:
        session.stop()
        old.kill()
    assert not wait_no_processes(tag, timeout=15)
