"""Where a cell's output goes: the kernel's own streams and display publisher."""

from __future__ import annotations

import sys
from collections.abc import Callable

from IPython.display import display, publish_display_data

from .._ranges import format_procs
from ..contract import SUMMARY_MIME


class Sink:
    """Where a cell's output goes: the kernel's streams and display publisher.

    Subclass it to capture output (tests, benchmarks).

    Parameters
    ----------
    on_summary : callable, optional
        Called with every mesh/sharding summary a process displays, before it is shown.
    """

    def __init__(self, on_summary: Callable[[dict], None] | None = None):
        self.on_summary = on_summary

    def stdout(self, text: str) -> None:
        """Write collated stdout text."""
        sys.stdout.write(text)
        sys.stdout.flush()

    def stderr(self, text: str) -> None:
        """Write collated stderr text."""
        sys.stderr.write(text)
        sys.stderr.flush()

    def display(self, rank: int, content: dict, label: bool) -> None:
        """Publish a rich display from process ``rank``."""
        if label:
            self.stdout(f"[{format_procs([rank])}] display:\n")
        summary = content.get("data", {}).get(SUMMARY_MIME)
        if summary is not None:
            self.view(summary)
            return
        publish_display_data(
            data=content.get("data", {}),
            metadata=content.get("metadata", {}),
            transient=content.get("transient"),
        )

    def view(self, summary: dict) -> None:
        """Show the widget for a summary that a process displayed."""
        # Deferred: the widgets take most of a second to import; most cells display no view.
        from ..widgets import view_for

        if self.on_summary is not None:
            self.on_summary(summary)
        display(view_for(summary))
