"""The dashboard's straggler view kept current: after each cell, while the processes record
their steps (``%jaxsys where on``), the kernel reads them as ``%jaxsys where`` does and
shows the summary.

The records are read between cells, when the processes are free to answer: a cell that
blocks the kernel holds the processes too, and its steps are shown as soon as it ends.
Clock offsets are measured once and again only when older than :data:`OFFSETS_MAX_AGE` or
for another world, so a cell costs two requests to each process, not seven.
Nothing here raises into the user's cell: a failed update says why in the view's note.
"""

from __future__ import annotations

import time

from ..cells import timeline
from ..cells.spmd import is_local_cell
from ..cells.stragglers_summary import summarize
from . import actions_where

# Seconds a measured set of clock offsets is reused for.
OFFSETS_MAX_AGE = 60.0
# Seconds the processes have to answer between two cells.
TIMEOUT = 5.0


def ran_everywhere(raw: str, spmd: bool) -> bool:
    """Whether a cell ran on every process: a ``%%multihost`` cell without ``--procs``, or
    in SPMD mode a cell that does not stay in the kernel. After any other cell the view is
    left as it is: a kernel cell ran no steps, and after a cell on some processes the
    others still hold the records of an older cell, which would be paired with its own."""
    first = next((ln.strip() for ln in raw.splitlines() if ln.strip()), "")
    if first.startswith("%%multihost"):
        return "--procs" not in first
    return spmd and not is_local_cell(raw)


class StragglersFeed:
    """Updates one straggler view after every cell while step records are kept.

    Parameters
    ----------
    session : MultihostSession
        The session whose cluster is read.
    view : StragglersView
        The view updated.
    """

    def __init__(self, session, view) -> None:
        self.session = session
        self.view = view
        self._offsets: tuple | None = None

    def start(self) -> StragglersFeed:
        """Show what the processes recorded so far and update after each later cell."""
        self.refresh()
        shell = self.session.shell
        if shell is not None:
            shell.events.register("post_run_cell", self._after_cell)
        return self

    def stop(self) -> None:
        """Stop updating the view."""
        shell = self.session.shell
        if shell is not None and self._after_cell in shell.events.callbacks["post_run_cell"]:
            shell.events.unregister("post_run_cell", self._after_cell)

    def _after_cell(self, result) -> None:
        raw = getattr(getattr(result, "info", None), "raw_cell", "") or ""
        if self.view.recording and ran_everywhere(raw, self.session.spmd):
            self.refresh()

    def offsets(self, cluster, ranks: list[int]) -> dict:
        """The processes' clock offsets, measured again when old or for another world."""
        key = (
            id(cluster),
            getattr(getattr(cluster, "world", None), "incarnation", 0),
            tuple(ranks),
        )
        now = time.monotonic()
        if (
            self._offsets is None
            or self._offsets[0] != key
            or now - self._offsets[1] > OFFSETS_MAX_AGE
        ):
            self._offsets = (key, now, timeline.measure_offsets(cluster, ranks))
        return self._offsets[2]

    def refresh(self) -> None:
        """Read the processes' step records and show them; never raises."""
        s = self.session
        cluster = s.cluster
        if cluster is None or s.still_running or s.broken:
            return
        try:
            ranks = list(cluster.ranks)
            on = actions_where.recording(cluster, ranks, timeout=TIMEOUT)
            if not on:
                self.view.update(recording=False)
                return
            analysed = actions_where.collect(
                cluster, ranks, self.offsets(cluster, ranks), timeout=TIMEOUT
            )
            self.view.update(
                summarize(analysed), recording=True, note=f"as of {time.strftime('%H:%M:%S')}"
            )
        except Exception as e:  # noqa: BLE001 - the view says why; the user's cell goes on
            self.view.update(note=f"not updated: {str(e)[:200]}")


__all__ = ["OFFSETS_MAX_AGE", "TIMEOUT", "StragglersFeed", "ran_everywhere"]
