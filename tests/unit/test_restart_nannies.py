"""A world restart waits for the old engines' nannies only while they can still speak."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from jaxsys_kernel.cluster import teardown


class _Launcher:
    def __init__(self, gone: bool):
        self.gone, self.engine_sets, self.killed = gone, {"s0": "set0", "s1": "set1"}, []

    def engine_set(self, rank):
        return f"set{rank}"

    def kill_engines(self, engine_sets, processes=()):
        self.killed.append(list(engine_sets))

    def nannies_gone(self) -> bool:
        return self.gone


def _world(launcher) -> SimpleNamespace:
    procs = [SimpleNamespace(rank=r, engine_id=r, nanny_pid=100 + r) for r in (0, 1)]
    return SimpleNamespace(
        launcher=launcher,
        ipp=SimpleNamespace(engines={"s0": 1, "s1": 1}),
        ranks=[0, 1],
        processes=procs,
        telemetry=None,
    )


@pytest.mark.parametrize("gone", [False, True])
def test_the_nanny_wait_is_skipped_when_the_hosts_went_with_them(monkeypatch, gone):
    waits: list[float] = []

    async def wait_dropped(world, ids, timeout):
        waits.append(timeout)

    async def unregister(world, ids):
        waits.append(teardown.UNREGISTER_WAIT_S)

    monkeypatch.setattr(teardown, "wait_dropped", wait_dropped)
    monkeypatch.setattr(teardown, "unregister", unregister)
    launcher = _Launcher(gone)
    asyncio.run(teardown.kill_world(_world(launcher)))
    assert launcher.killed == [["set0", "set1"]]
    # Nannies that live on (their hosts do) get their time to tell the hub; nannies whose
    # pods were deleted never will, and the ids are freed at once.
    want = (
        [teardown.UNREGISTER_WAIT_S]
        if gone
        else [teardown.NANNY_WAIT_S, teardown.UNREGISTER_WAIT_S]
    )
    assert waits == want
