"""The records and errors a cluster's modules share: what is known of each process, the
progress of long waits, and what goes wrong."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ..errors import ClusterError

__all__ = ["ClusterError", "ClusterStartError", "ProcessInfo", "ProgressEvent"]


class ClusterStartError(ClusterError):
    """The cluster could not be brought up; nothing it started is left running."""


@dataclass
class ProcessInfo:
    """What the kernel knows about one JAX process.

    Attributes
    ----------
    rank : int
        JAX process index (``jax.process_index()``).
    engine_id : int or None
        ipyparallel engine id serving this rank; None before registration.
    pid : int or None
        Operating-system pid of the engine.
    host : str
        Host name the process runs on.
    devices : list of int
        Ids of the process's local JAX devices.
    state : str
        ``starting``, ``ready``, ``dead`` or ``failed``.
    """

    rank: int
    engine_id: int | None = None
    pid: int | None = None
    host: str = ""
    address: str = ""
    nanny_pid: int | None = None
    # When the process started, as it reported (psutil's create_time): a teardown signals
    # its pid only while it still names this process.
    started: float | None = None
    devices: list[int] = field(default_factory=list)
    platform: str = ""
    state: str = "starting"
    # The jax.distributed.initialize arguments and JAX options the process reported
    # (for %jaxsys start --explain); not part of the status rows.
    init_call: dict = field(default_factory=dict)
    init_settings: list = field(default_factory=list)
    # How the kernel learnt that the process died (for error messages); "" while alive.
    died: str = ""

    def mark_dead(self, how: str) -> None:
        """Record the process as dead, and how the kernel learnt it."""
        self.state, self.died = "dead", how

    def to_dict(self) -> dict:
        """Return the fields as a plain, JSON-ready dict (without the initialisation record)."""
        d = asdict(self)
        del d["init_call"], d["init_settings"], d["died"], d["started"]
        return d

    @classmethod
    def from_description(cls, rank: int, info: dict) -> ProcessInfo:
        """The record of a process from what ``bootstrap.describe_process`` reported."""
        return cls(
            rank=rank,
            engine_id=info["engine_id"],
            pid=info["pid"],
            host=info["host"],
            address=info["address"],
            nanny_pid=info["nanny_pid"],
            started=_number(info.get("started")),
        )


@dataclass
class ProgressEvent:
    """One step of a long wait: ``done`` of ``total`` for a named stage."""

    stage: str
    done: int
    total: int


def _number(value) -> float | None:
    """A reported number, or None for anything else (engines' reports are untrusted)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
