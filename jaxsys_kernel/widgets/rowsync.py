"""Rows keyed by rank kept in step with a view's front end by deltas, not whole lists.

A view's synced list trait (the rows it draws) is sent whole once, when the front end
asks for the widget's state; after that :class:`RowSync` changes the trait without sending
it and sends a custom message with what changed (:class:`~jaxsys_kernel.telemetry.
aggregate.RowFeed`), which the front end (``static/shared.js``) applies to its copy of the
trait. The front end's copy is therefore current, and a saved notebook keeps it. Above
:data:`~jaxsys_kernel.telemetry.aggregate.ROWS_UP_TO` processes the rows drawn are those
of the group the front end opened, and a summary of all of them is a trait of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import traitlets

from ..telemetry import aggregate


class RowSync:
    """The deltas of one view's rows.

    Parameters
    ----------
    widget : anywidget.AnyWidget
        The view; its ``_quiet`` set names traits changed without being sent.
    trait : str
        The synced list trait holding the rows drawn.
    summarize : callable
        Turns every row into the summary shown above the group size.
    ages : bool
        Whether rows carry heartbeat ages (sent apart, for the rows drawn).
    """

    def __init__(self, widget, trait: str, summarize: Callable[[list[dict]], dict], ages: bool):
        self.widget = widget
        self.trait = trait
        self.summarize = summarize
        self.feed = aggregate.RowFeed(ages=ages)
        self.records: list[dict] = list(getattr(widget, trait))
        self.feed.update(self.records)
        widget.rows_version = self.feed.version

    def shown(self) -> list[dict]:
        """The rows drawn: every row up to the group size, else the open group's."""
        n = len(self.records)
        if n <= aggregate.ROWS_UP_TO:
            return self.records
        group = self.widget.open_group
        if group is None or not 0 <= group < -(-n // aggregate.group_size(n)):
            return []
        return aggregate.group_rows(self.records, group, n)

    def set(self, records: list[dict] | None = None, extra: dict | None = None) -> None:
        """Take new rows (None: the same rows, another group open) and send the delta, in
        one message with ``extra`` (the view's other changes, such as appended lines)."""
        w = self.widget
        if records is not None:
            self.records = records
        large = len(self.records) > aggregate.ROWS_UP_TO
        summary = self.summarize(self.records) if large else {}
        shown = self.shown()
        message = self.feed.update(shown)
        with w.hold_sync():
            if w.summary != summary:
                w.summary = summary
            w._quiet.update((self.trait, "rows_version"))
            try:
                setattr(w, self.trait, shown)
                w.rows_version = self.feed.version
            finally:
                w._quiet.difference_update((self.trait, "rows_version"))
        if message["rows"] or message["gone"] or message.get("ages") or extra:
            w.send({"type": "rows", "trait": self.trait, **message, **(extra or {})})

    def resync(self) -> None:
        """Send the rows whole (the front end holds another version than the deltas')."""
        self.widget.send_state([self.trait, "rows_version", "summary"])


def change_log(view, log: list[str] | None, extra: list[str], keep: int) -> dict:
    """Replace (``log``) or extend (``extra``) a view's ``event_log``; returns what to send
    for appended lines (a replaced log is sent whole, as a trait)."""
    if log is not None:
        with view.hold_sync():
            view.event_log = (list(log) + extra)[-keep:]
        return {}
    if not extra:
        return {}
    # Appended lines travel alone; the front end appends them to its copy.
    view._quiet.add("event_log")
    try:
        view.event_log = (view.event_log + extra)[-keep:]
    finally:
        view._quiet.discard("event_log")
    return {"log": {"append": extra[-keep:], "keep": keep}}


def cache_summary(stats: list[dict]) -> dict:
    """Compilation-cache numbers summed by group of ranks, for more than ROWS_UP_TO rows."""
    n = len(stats)
    size = aggregate.group_size(n)
    keys = ("requests", "hits", "compiles", "compile_time", "time_saved", "shared")
    groups = []
    for start in range(0, n, size):
        part = stats[start : start + size]
        totals = {k: sum(s.get(k) or 0 for s in part) for k in keys}
        groups.append(
            {
                "group": start // size,
                "ranks": f"{part[0].get('rank', start)}-{part[-1].get('rank', start)}",
                **totals,
                "entries": max((s.get("entries") or 0) for s in part),
                "bytes": max((s.get("bytes") or 0) for s in part),
            }
        )
    return {"group_size": size, "groups": groups}


class RowsMixin(traitlets.HasTraits):
    """A view of rows keyed by rank, kept in step by :class:`RowSync` deltas (put it before
    the widget class in the bases: it decides which trait changes are sent)."""

    # Above the group size: the summary of every row, and the group the front end opened.
    summary = traitlets.Dict().tag(sync=True)
    open_group = traitlets.Int(None, allow_none=True).tag(sync=True)
    rows_version = traitlets.Int(0).tag(sync=True)

    def _should_send_property(self, key: str, value: Any) -> bool:
        # Traits a RowSync changes are kept in step by its deltas, not resent whole.
        if key in self.__dict__.get("_quiet", ()):
            return False
        return super()._should_send_property(key, value)

    def _start_rows(self, trait: str, summarize, ages: bool) -> None:
        self._quiet: set[str] = set()
        self._rows = RowSync(self, trait, summarize, ages)
        if len(self._rows.records) > aggregate.ROWS_UP_TO:
            self._rows.set()
        self.on_msg(self._on_rows_msg)

    def _on_rows_msg(self, _widget, content, _buffers) -> None:
        if isinstance(content, dict) and content.get("type") == "resync":
            self._rows.resync()

    @traitlets.observe("open_group")
    def _group_opened(self, _change) -> None:
        if hasattr(self, "_rows"):
            self._rows.set()
