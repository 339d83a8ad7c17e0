"""The session's live dashboard: telemetry subscriptions feeding the views, and the last
mesh and sharding a cell displayed."""

from __future__ import annotations

import time

from IPython.core.error import UsageError

from ..cluster.audit import refusal_notice
from . import actions_guard
from .stragglers_feed import StragglersFeed


def _short_notice(line: str) -> str:
    """A refusal notice without the prefix and the pointer, for the dashboard's log."""
    return line.removeprefix("jaxsys: the coordination service ").split(". The cluster")[0]


def launch_counts(cluster) -> tuple[int, dict[int, int]]:
    """The world's incarnation and, per process, how often it was restarted alone.

    A process restarted alone joins the same world, so its incarnation stays; the restart
    count is what tells it from its predecessor (both zero for a cluster that keeps none).
    """
    world = getattr(cluster, "world", None)
    if world is None:
        return 0, {}
    return world.incarnation, dict(world.rank_restarts)


def process_liveness(cluster) -> list:
    """Each process's Liveness from the cluster's telemetry, with its restart count.

    The one reading of liveness that the dashboard and the sidebar's comm share.
    """
    _, restarts = launch_counts(cluster)
    lives = cluster.telemetry.liveness({p.rank: p.state for p in cluster.processes})
    for live in lives:
        live.restarts = restarts.get(live.rank, 0)
    return lives


class DashboardWiring:
    """The dashboard and the summaries it shows (a part of
    :class:`~jaxsys_kernel.magics.session.MultihostSession`)."""

    def show_dashboard(self, max_rate: float = 10.0):
        """A live dashboard: mesh, sharding, cache hits, liveness and stragglers.

        The mesh and sharding panes show the last ones displayed in a ``%%multihost`` cell;
        cache and liveness update from telemetry while cells run, at most ``max_rate``
        times a second; the straggler view after each cell while ``%jaxsys where on``
        records steps. A new dashboard takes over the live updates from the previous one.
        """
        # Deferred: the widgets (anywidget, ipywidgets) take most of a second to import,
        # which a kernel that never shows a dashboard should not pay at start.
        from ..widgets.stragglers import StragglersDashboard

        cluster = self.require_cluster()
        hub = cluster.telemetry
        if hub is None:
            raise UsageError("this cluster runs without telemetry; start one with telemetry on")
        if self._unsubscribe is not None:
            self._unsubscribe()
        dash = StragglersDashboard(
            mesh=self.last_summaries.get("mesh"), sharding=self.last_summaries.get("sharding")
        )
        previous: dict[int, str] = {}
        # Refusals from before the dashboard are in %jaxsys security; the log shows new ones.
        told = {(r.host, r.error): r.attempts for r in hub.refusals()}
        transfers_told: dict[int, dict] = {}

        def refresh(h) -> None:
            cluster.refresh_states()
            lives = process_liveness(cluster)
            changes = []
            for live in lives:
                if previous.get(live.rank) != live.state:
                    before = previous.get(live.rank, "-")
                    changes.append(
                        f"{time.strftime('%H:%M:%S')} p{live.rank}: {before} -> {live.state}"
                    )
                    previous[live.rank] = live.state
            for line in refusal_notice(told, h.refusals()):
                changes.append(f"{time.strftime('%H:%M:%S')} {_short_notice(line)}")
            changes += actions_guard.transfer_notice(transfers_told, h.transfer_counts())
            health = h.health().line()
            with dash.live.hold_sync():
                if dash.live.telemetry_health != health:
                    dash.live.telemetry_health = health
                dash.update(
                    cache=[c.to_dict() for c in h.cache_stats()],
                    live=[live.to_dict() for live in lives],
                    append=changes,
                )

        refresh(hub)
        self._attach_controls(dash.live)
        self.dashboard = dash
        unsubscribe = hub.subscribe(refresh, max_rate=max_rate)
        feed = StragglersFeed(self, dash.stragglers).start()
        self._unsubscribe = lambda: (unsubscribe(), feed.stop())
        return dash

    def _forget_summaries(self) -> None:
        """Drop the mesh and sharding of a world that is gone (a new cluster or a world
        restart): their devices no longer exist, so the dashboard must not keep drawing them."""
        self.last_summaries.clear()
        if self.dashboard is not None:
            # Empty summaries draw the views' "nothing displayed yet" state.
            self.dashboard.update(mesh={}, sharding={})

    def _remember_summary(self, summary: dict) -> None:
        self.last_summaries[summary.get("kind", "")] = summary
        if self.dashboard is not None:
            if summary.get("kind") == "mesh":
                self.dashboard.update(mesh=summary)
            elif summary.get("kind") == "sharding":
                self.dashboard.update(sharding=summary)
