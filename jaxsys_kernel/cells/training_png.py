"""The training chart as a PNG picture: what every notebook reader shows (see
:mod:`jaxsys_kernel.widgets.raster` for why PNG beside the SVG).

The same drawing as :mod:`.training_svg`: the goodput, loss and step per process over time
with each outage shaded, and a recovery strip per fault with its phases in ms.
"""

from __future__ import annotations

import base64
import bisect
import math

from .._ranges import format_procs
from ..data.draw import process_colour
from ..widgets.pictures import wrap
from ..widgets.raster import CHAR_H, LINE_H, Canvas, fit, text_width
from .training_chart import TrainingLog
from .training_svg import (
    MAX_DRAWN,
    MAX_LINES,
    OUTAGE,
    PHASE_COLOURS,
    PHASES,
    fraction,
    summary_text,
)

WIDTH = 760
LEFT, RIGHT, MARGIN = 84, 8, 6
PANEL = 120
BAR = 14
MUTED = "#555555"


def _segment(canvas: Canvas, a: tuple[float, float], b: tuple[float, float], colour: str):
    """A line two pixels wide from ``a`` to ``b``, as boxes one pixel apart."""
    n = int(max(abs(b[0] - a[0]), abs(b[1] - a[1]), 1))
    for i in range(n + 1):
        f = i / n
        canvas.box(a[0] + (b[0] - a[0]) * f - 1, a[1] + (b[1] - a[1]) * f - 1, 2, 2, fill=colour)


def _panel(canvas: Canvas, log: TrainingLog, top: int, key: int, label: str, x_of) -> None:
    """Axis box, outages shaded, one line per process and attempt of value ``key``."""
    procs = sorted(log.points)[:MAX_LINES]
    values = [pt[key] for p in procs for pt in log.points[p] if math.isfinite(pt[key])]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    for a, b in log.outages():
        canvas.box(x_of(a), top, max(1.0, x_of(b) - x_of(a)), PANEL, fill=OUTAGE)
    canvas.box(LEFT, top, WIDTH - LEFT - RIGHT, PANEL, edge="#999999")
    canvas.text(MARGIN, top, label)
    canvas.text(MARGIN, top + LINE_H, fit(f"{hi:.4g}", LEFT - MARGIN - 2), MUTED)
    canvas.text(MARGIN, top + PANEL - CHAR_H, fit(f"{lo:.4g}", LEFT - MARGIN - 2), MUTED)
    for p in procs:
        pts = log.points[p]
        every = max(1, len(pts) // MAX_DRAWN)
        prev = None
        for t, *vals in pts[::every]:
            v = vals[key - 1]
            here = (x_of(t), top + PANEL - fraction(v, lo, hi) * (PANEL - 8) - 4)
            attempt = bisect.bisect_right(log.attempts, t)
            if not math.isfinite(v):
                prev = None
                continue
            if prev is not None and prev[0] == attempt:
                _segment(canvas, prev[1], here, process_colour(p))
            else:
                canvas.box(here[0] - 1, here[1] - 1, 3, 3, fill=process_colour(p))
            prev = (attempt, here)


def _legend(canvas: Canvas, y: int, items: list[tuple[str, str]]) -> None:
    x = LEFT
    for name, colour in items:
        canvas.box(x, y, CHAR_H, CHAR_H, fill=colour)
        canvas.text(x + CHAR_H + 4, y, name)
        x += CHAR_H + 16 + text_width(name)


def _strips(canvas: Canvas, log: TrainingLog, top: int, lines: list[list[str]]) -> None:
    """One strip per fault: its name, a bar of its phases, their times."""
    faults = log.recoveries[:MAX_LINES]
    longest = max((ms or 0.0) for r in faults for _, ms in r.phases_ms()) or 1.0
    scale = (WIDTH - LEFT - RIGHT) / longest
    _legend(canvas, top, list(zip(PHASES, PHASE_COLOURS, strict=True)))
    y = top + LINE_H + 4
    for i, (r, text) in enumerate(zip(faults, lines, strict=True), 1):
        canvas.text(MARGIN, y, fit(f"fault {i}: {r.what} ({r.kind}: {format_procs(r.who)})",
                                   WIDTH - 2 * MARGIN))  # fmt: skip
        y += LINE_H
        x, prev = float(LEFT), 0.0
        for (_, ms), colour in zip(r.phases_ms(), PHASE_COLOURS, strict=True):
            if ms is not None:
                w = max(1.0, (ms - prev) * scale)
                canvas.box(x, y, w, BAR, fill=colour)
                x, prev = x + w, ms
        y += BAR + 4
        for line in text:
            canvas.text(LEFT, y, line, MUTED)
            y += LINE_H


def _phase_lines(log: TrainingLog) -> list[list[str]]:
    out = []
    for r in log.recoveries[:MAX_LINES]:
        said = " · ".join(f"{n} +{ms:.0f} ms" for n, ms in r.phases_ms() if ms is not None)
        out.append(wrap(said, WIDTH - LEFT - RIGHT))
    return out


def training_picture(log: TrainingLog) -> Canvas:
    """The chart as a :class:`~jaxsys_kernel.widgets.raster.Canvas`."""
    head = summary_text(log).splitlines()[0].replace("; ", " · ")
    title = wrap(head, WIDTH - 2 * MARGIN)
    phases = _phase_lines(log)
    faults = len(phases)
    strips = LINE_H + 4 + sum((LINE_H + BAR + 4 + LINE_H * len(p)) for p in phases)
    top = MARGIN + LINE_H * (len(title) + 1)
    axis = top + 2 * (PANEL + 8)
    canvas = Canvas(WIDTH, axis + LINE_H + (strips + 4 if faults else 0) + MARGIN)
    for i, line in enumerate(title):
        canvas.text(MARGIN, MARGIN + i * LINE_H, fit(line, WIDTH - 2 * MARGIN))
    procs = sorted(log.points)[:MAX_LINES]
    _legend(
        canvas, top - LINE_H, [(f"p{p}", process_colour(p)) for p in procs] + [("outage", OUTAGE)]
    )
    end = log.end if log.end is not None else log.clock()
    span = max(end - log.start, 1e-3)

    def x_of(t: float) -> float:
        return LEFT + (t - log.start) / span * (WIDTH - LEFT - RIGHT)

    _panel(canvas, log, top, 2, "loss", x_of)
    _panel(canvas, log, top + PANEL + 8, 1, "step", x_of)
    canvas.text(LEFT, axis, "0 s", MUTED)
    canvas.text(WIDTH - RIGHT - text_width(f"{span:.1f} s"), axis, f"{span:.1f} s", MUTED)
    if faults:
        _strips(canvas, log, axis + LINE_H + 4, phases)
    return canvas


def training_png(log: TrainingLog) -> str:
    """The chart as base64 PNG, for an ``image/png`` output."""
    return base64.b64encode(training_picture(log).png()).decode("ascii")


__all__ = ["training_picture", "training_png"]
