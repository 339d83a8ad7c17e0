"""The training chart of a ``%%multihost --retries`` cell, drawn while the cell runs.

The cell's shown output is read as it is written (:class:`.training_chart.TrainingLog`
parses the ``step N loss L`` lines the program prints); once a step has been seen the chart
is displayed, then redrawn in place at most every :data:`LIVE_EVERY` seconds and after each
fault, and a last time when the cell ends. A saved notebook keeps the last picture: SVG
(with tooltips) where the notebook is trusted, PNG where it is not, and the same facts as
text for readers without pictures.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from IPython.display import display

from ..cells.training_chart import TrainingLog
from ..cells.training_svg import summary_text, training_svg

#: Seconds between two redraws while steps come in.
LIVE_EVERY = 2.0


class Chart:
    """A display of ``log`` that can be redrawn in place."""

    def __init__(self, log: TrainingLog):
        self.log = log
        self.handle = None
        self.drawn_at = -float("inf")
        self.failed = False

    def draw(self, force: bool = False) -> None:
        """Show or redraw the chart: now if ``force``, else if the last draw is old enough.

        A chart that fails to draw says so once and is not drawn again: the cell it watches
        goes on.
        """
        if not self.log.has_steps() or self.failed:
            return
        try:
            self._draw(force)
        except Exception as e:  # noqa: BLE001 - never let the picture end a training cell
            self.failed = True
            print(f"jaxsys: the training chart could not be drawn: {e!r}", file=sys.stderr)

    def _draw(self, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self.drawn_at < LIVE_EVERY:
            return
        self.drawn_at = now
        # Deferred: the picture's font and canvas load with the widgets (most of a second).
        from ..cells.training_png import training_png

        bundle = {
            "text/plain": summary_text(self.log),
            "image/svg+xml": training_svg(self.log),
            "image/png": training_png(self.log),
        }
        if self.handle is None:
            self.handle = display(bundle, raw=True, display_id=True)
        else:
            self.handle.update(bundle, raw=True)


class _Tee:
    """Passes writes on to ``stream`` and reads them into the chart's log."""

    def __init__(self, stream, chart: Chart):
        self._stream = stream
        self._chart = chart

    def write(self, text: str):
        n = self._stream.write(text)
        if isinstance(text, str) and self._chart.log.feed(text):
            self._chart.draw()
        return n

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextmanager
def watching() -> Iterator[Chart]:
    """Read what the cell shows on stdout into a chart until the block ends; draw it last."""
    chart = Chart(TrainingLog())
    tee = _Tee(sys.stdout, chart)
    sys.stdout = tee
    try:
        yield chart
    finally:
        if sys.stdout is tee:  # whoever replaced it since keeps their own
            sys.stdout = tee._stream
        chart.log.finish()
        chart.draw(force=True)


__all__ = ["LIVE_EVERY", "Chart", "watching"]
