"""What the owner of a named cluster publishes for its watchers every few seconds.

``jaxsys cluster start`` owns the cluster's telemetry (compilation-cache hits and misses
per process) and is the one that may ask the processes for their step records. Every
:data:`~jaxsys_kernel.cluster.watch_snapshot.PERIOD` seconds it writes both, bounded, to
the snapshot file watchers read (:mod:`jaxsys_kernel.cluster.watch_snapshot`).

The step records cost the processes a request, so they are asked only while no process
is busy, with a small request first (how many steps each holds and the latest one) and the
records themselves only when that answer changed. Nothing here raises: the owner's
cluster runs on whatever a snapshot meets, and the snapshot says why its steps are missing.
"""

from __future__ import annotations

import os
import time

from ..cluster import watch_snapshot as snap
from ..engine.registry import engine_module
from . import timeline
from .stragglers import Stragglers
from .stragglers_summary import summarize

arrivals = engine_module("arrivals")
#: Seconds the processes have to answer one request of a snapshot.
TIMEOUT = 5.0
#: Seconds a measured set of clock offsets is reused for.
OFFSETS_MAX_AGE = 60.0
#: Step records fetched from each process at most (each some 200 bytes).
FETCH_STEPS = 500


class OwnerSnapshot:
    """Writes a cluster's live numbers for its watchers.

    Parameters
    ----------
    cluster : Cluster
        The running cluster this process owns.
    path : path-like
        The snapshot file (:func:`~jaxsys_kernel.cluster.watch_snapshot.snapshot_path`).
    period : float
        Seconds between two snapshots.
    """

    def __init__(self, cluster, path, period: float = snap.PERIOD) -> None:
        self.cluster, self.path, self.period = cluster, path, period
        self.last = 0.0
        self.stragglers: dict | None = None
        self.note = "not recorded (the processes record their steps once arrivals.enable() ran)"
        self._counts: dict | None = None
        self._offsets: tuple[float, dict] | None = None

    def tick(self, now: float | None = None) -> None:
        """Write a snapshot when the last is ``period`` seconds old; never raises."""
        now = time.monotonic() if now is None else now
        if now - self.last < self.period:
            return
        self.last = now
        try:
            self.steps()
            snap.write(self.path, self.snapshot())
        except Exception:  # noqa: BLE001 - the cluster runs on; the next tick tries again
            pass

    def snapshot(self) -> dict:
        """The snapshot's content, bounded whatever the world's size."""
        hub = getattr(self.cluster, "telemetry", None)
        cache = None
        if hub is not None:
            rows = hub.cache_stats()[: snap.MAX_ROWS]
            cache = [{k: int(getattr(s, k)) for k in snap.CACHE_FIELDS} for s in rows]
        return {
            "v": snap.VERSION,
            "written": time.time(),
            "pid": os.getpid(),
            "cache": cache,
            "stragglers": self.stragglers,
            "note": self.note[: snap.MAX_TEXT],
        }

    def idle(self) -> bool:
        """Whether no process is busy with a cell, as their heartbeats say."""
        hub = getattr(self.cluster, "telemetry", None)
        return hub is None or not any(p.busy for p in hub.liveness())

    def steps(self) -> None:
        """Fetch the processes' step records when their count changed and they are idle."""
        if not self.idle():
            return
        ranks = list(self.cluster.ranks)
        try:
            told = self._ask(ranks, 1)
            if not all(t.get("on") is True for t in told.values()):
                self.note = "not recorded (the processes record steps once arrivals.enable() ran)"
                self._counts = None
                return
            # The count and the latest record: a new cell of as many steps still differs.
            counts = {r: (t.get("dropped"), repr(t.get("steps"))) for r, t in told.items()}
            if counts == self._counts:
                return
            view = self._collect(ranks)
            self._counts = counts
            self.stragglers = bounded(summarize(view, steps=snap.MAX_STEPS), view)
            self.note = f"as of {time.strftime('%H:%M:%S')}"
        except Exception as e:  # noqa: BLE001 - said in the snapshot's note
            self.note = f"not updated: {str(e)[:150]}"

    def _ask(self, ranks: list[int], last: int) -> dict:
        calls = self.cluster.call(ranks, arrivals.records, last, timeout=TIMEOUT)
        if calls.errors or calls.missing:
            raise RuntimeError(
                f"processes {sorted({*calls.errors, *calls.missing})} did not answer"
            )
        if not all(isinstance(t, dict) for t in calls.results.values()):
            raise RuntimeError("a process's answer is not a record set")
        return calls.results

    def _collect(self, ranks: list[int]) -> Stragglers:
        now = time.monotonic()
        if self._offsets is None or now - self._offsets[0] > OFFSETS_MAX_AGE:
            self._offsets = (now, timeline.measure_offsets(self.cluster, ranks))
        offsets = self._offsets[1]
        view = Stragglers(
            ranks,
            {r: o.seconds for r, o in offsets.items()},
            {r: o.error for r, o in offsets.items()},
        )
        for r, told in self._ask(ranks, FETCH_STEPS).items():
            steps = told.get("steps")
            if not isinstance(steps, list) or len(steps) > FETCH_STEPS:
                view.refused[r] = f"its answer is not a list of at most {FETCH_STEPS} steps"
                continue
            for record in steps:
                view.add(r, record)
        return view

    def remove(self) -> None:
        """Remove the snapshot (the cluster is gone)."""
        for p in (self.path, self.path.with_name(f".{self.path.name}.part")):
            try:
                os.unlink(p)
            except OSError:
                pass


def bounded(summary: dict, view: Stragglers) -> dict:
    """The straggler summary's part a watcher shows: the latest steps, the process named,
    and the mean step time (the longest mean total over the processes)."""
    means = view.breakdown()
    step_time = max((sum(parts.values()) for parts in means.values()), default=0.0)
    return {
        "steps_total": summary["steps_total"],
        "step_time": step_time if view.findings else 0.0,
        "named": summary["named"],
        "steps": summary["steps"][-snap.MAX_STEPS :],
    }


__all__ = ["OwnerSnapshot", "bounded"]
