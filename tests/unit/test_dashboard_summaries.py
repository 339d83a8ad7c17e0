"""A world that is gone leaves no picture behind: a world restart or a new cluster clears the
mesh and sharding the dashboard shows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jaxsys_kernel.engine.summaries import fake_devices, fake_mesh, mesh_info
from jaxsys_kernel.magics import lifecycle
from jaxsys_kernel.magics.session import MultihostSession
from jaxsys_kernel.telemetry.hub import TelemetryHub

from .test_world_views import SHARDING, WorldCluster


@pytest.fixture
def session():
    hub = TelemetryHub(2, curve=False, interval=0.5)
    s = MultihostSession()
    s.cluster = WorldCluster(hub)
    yield s
    if s._unsubscribe is not None:
        s._unsubscribe()
    hub.close()


# -- a restarted world or a new cluster forgets the old mesh and sharding ----------------------


def _mesh() -> dict:
    return mesh_info(fake_mesh(fake_devices(2, 1), (2,), ("x",)))


def test_a_world_restart_clears_the_dashboards_mesh_and_sharding(session):
    session._remember_summary(_mesh())
    session._remember_summary(SHARDING)
    dash = session.show_dashboard()
    assert dash.mesh.info["kind"] == "mesh" and dash.sharding.info["kind"] == "sharding"
    session.restart()
    assert session.cluster.restarts == 1
    assert session.last_summaries == {}
    assert dash.mesh.info == {} and dash.sharding.info == {}
    # A dashboard shown after the restart starts empty too, and shows the next mesh.
    again = session.show_dashboard()
    assert again.mesh.info == {} and "<empty mesh>" in again._repr_mimebundle_()[0]["text/plain"]
    session._remember_summary(_mesh())
    assert again.mesh.info["kind"] == "mesh"


def test_a_new_cluster_starts_with_no_summaries(session, monkeypatch):
    session._remember_summary(_mesh())
    session.cluster.state = "stopped"
    started = SimpleNamespace(
        nprocs=2,
        devices_per_host=1,
        ready_seconds=0.1,
        coordinator_address="127.0.0.1:1",
        security="mTLS",
        start_sync=lambda: None,
        state="ready",
    )
    monkeypatch.setattr(lifecycle, "Cluster", lambda **kwargs: started)
    session.start(hosts=2, devices_per_host=1)
    assert session.cluster is started and session.last_summaries == {}
