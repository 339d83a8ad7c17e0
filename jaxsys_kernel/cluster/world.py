"""The state of one cluster's JAX world, apart from the facade that drives it.

A :class:`World` is what bring-up fills in and teardown empties: the profile directory,
the incarnation, where the coordinator is, the certificates, the telemetry hub, every
process's record and the ipyparallel client that reaches their engines. ``bringup`` and
``teardown`` receive the world and change only it; :class:`~jaxsys_kernel.cluster.Cluster`
owns one and reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import ClusterConfig
from .launchers import EngineContext
from .records import ProcessInfo

__all__ = ["World"]


def _no_progress(stage: str, done: int, total: int) -> None:
    """Progress goes nowhere unless the cluster supplies a reporter."""


@dataclass(eq=False)
class World:
    """One cluster's processes and the services they share.

    Attributes
    ----------
    config : ClusterConfig
        The validated options.
    launcher : Launcher
        Where engines run and how they are reached (chosen once from ``config``).
    report : callable
        ``report(stage, done, total)`` for progress of long waits.
    profile : Path or None
        The cluster's ipyparallel profile directory, while it runs.
    incarnation : int
        How many times every rank was launched: 1 after the start, +1 per world restart.
    early_coordinator : str or None
        Where local engines learn the coordinator at launch (None: after registration).
    coordinator_address : str or None
        The coordination service's ``host:port``, once known.
    pki : ClusterPKI or None
        The certificates (mTLS), or None without.
    telemetry : TelemetryHub or None
        The kernel-side receiver of the engines' telemetry.
    processes : list of ProcessInfo
        One record per rank.
    client, view
        ipyparallel's client, and a blocking view on every engine in rank order.
    rank_restarts : dict
        How often each rank was restarted alone in this incarnation's lifetime.
    standby : Standby or None
        Engines booted ahead of need (see :mod:`~jaxsys_kernel.cluster.standby`).
    spare_world : SpareWorld or None
        A next world already joined to JAX (see :mod:`~jaxsys_kernel.cluster.spare_world`).
    keep_logs : bool
        Whether the teardown keeps the engine logs (an error names them, see
        :func:`~jaxsys_kernel.cluster.profile.keep_logs`).
    """

    config: ClusterConfig
    launcher: Any
    report: Callable[[str, int, int], None] = _no_progress
    profile: Path | None = None
    incarnation: int = 0
    early_coordinator: str | None = None
    coordinator_address: str | None = None
    pki: Any = None
    telemetry: Any = None
    processes: list[ProcessInfo] = field(default_factory=list)
    client: Any = None
    view: Any = None
    rank_restarts: dict[int, int] = field(default_factory=dict)
    standby: Any = None
    spare_world: Any = None
    keep_logs: bool = False

    @property
    def ipp(self):
        """ipyparallel's Cluster (controller and engine launchers), or None when stopped."""
        return self.launcher.ipp

    @property
    def ranks(self) -> list[int]:
        """All process indices."""
        return self.config.ranks

    def engine_context(self) -> EngineContext:
        """What a launcher needs to start this incarnation's engines."""
        return EngineContext(
            incarnation=self.incarnation,
            coordinator=self.early_coordinator,
            profile=self.profile,
            pki=self.pki,
            telemetry=self.telemetry,
        )

    def standby_context(self) -> EngineContext:
        """What a standby engine is launched with: no coordinator, so it only boots and
        imports JAX, and the next incarnation, which it is told again when it takes over."""
        return EngineContext(
            incarnation=self.incarnation + 1,
            coordinator=None,
            profile=self.profile,
            pki=self.pki,
            telemetry=self.telemetry,
        )

    def reserved_ids(self) -> set[int]:
        """Engine ids given to standby and spare-world engines, never taken for a rank's own
        engine."""
        ids = set(self.standby.reserved) if self.standby is not None else set()
        if self.spare_world is not None:
            ids |= self.spare_world.reserved
        return ids

    def refusal_records(self) -> list:
        """Handshakes the coordination service refused (none without mTLS or telemetry)."""
        if self.telemetry is None or self.pki is None:
            return []
        return self.telemetry.refusals()

    def rank_to_engine(self) -> dict[int, int | None]:
        """The engine id serving each rank."""
        return {p.rank: p.engine_id for p in self.processes}
