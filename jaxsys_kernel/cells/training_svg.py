"""A training run as a static SVG picture and as text, kept in saved notebooks.

Two panels share the time axis (seconds since the cell was sent): loss and step, one line
per process, each fault's outage shaded. Under them, one recovery strip per fault: from the
last step shown before it to its detection, the world's restart, the program's restore and
its first good step, in ms. The title gives the goodput.
"""

from __future__ import annotations

import bisect
import math
from html import escape

from .._ranges import format_procs
from ..data.draw import process_colour
from .training_chart import MAX_POINTS, TrainingLog

WIDTH = 640
LEFT, RIGHT = 52, 12
PANEL = 110
STRIP = 34
OUTAGE = "#f4cccc"
PHASES = ("detected", "world restarted", "restored", "first good step")
PHASE_COLOURS = ("#d62728", "#ff7f0e", "#9467bd", "#2ca02c")
# Lines drawn, and points per line (evenly thinned): the picture stays small.
MAX_LINES = 16
MAX_DRAWN = 400


def summary_text(log: TrainingLog) -> str:
    """The run in words: processes, last step and loss, goodput, and each fault's recovery."""
    productive, wall, redone = log.goodput()
    last = log.last()
    head = f"training: {format_procs(sorted(log.points)) or 'no process'}"
    if last is not None:
        head += f", step {last[0]}, loss {last[1]:.4g}"
    head += (
        f"; goodput {productive / wall if wall else 0.0:.2f} ({productive:.1f} s productive of "
        f"{wall:.1f} s wall); {redone} step{'s' * (redone != 1)} done again"
    )
    lines = [head]
    for i, r in enumerate(log.recoveries, 1):
        parts = [f"fault {i}: {r.what} ({r.kind}: {format_procs(r.who)})"]
        for name, ms in r.phases_ms():
            if ms is not None:
                extra = (
                    f" (step {r.restored_step})" if name == "restored" and r.restored_step else ""
                )
                parts.append(f"{name} +{ms:.0f} ms{extra}")
        lines.append(", ".join(parts))
    if log.dropped:
        lines.append(f"{log.dropped} points left out: at most {MAX_POINTS} are kept")
    return "\n".join(lines)


def fraction(v: float, lo: float, hi: float) -> float:
    """Where ``v`` lies from ``lo`` (0) to ``hi`` (1); 0 where that cannot be said (values
    near the float's limits, whose differences overflow)."""
    f = (v - lo) / ((hi - lo) or 1.0)
    return min(1.0, max(0.0, f)) if math.isfinite(f) else 0.0


def _thin(pts: list, most: int = MAX_DRAWN) -> list:
    if len(pts) <= most:
        return pts
    every = len(pts) / most
    return [pts[int(i * every)] for i in range(most)] + [pts[-1]]


def _panel(log, top: float, key: int, label: str, x_of) -> list[str]:
    """One panel: axis, the outages shaded, one polyline per process of value ``key``."""
    drawn = {p: _thin(pts) for p, pts in sorted(log.points.items())[:MAX_LINES]}
    values = [pt[key] for pts in drawn.values() for pt in pts if math.isfinite(pt[key])]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)

    def y_of(v: float) -> float:
        return top + PANEL - fraction(v, lo, hi) * (PANEL - 8) - 4

    out = [
        f'<rect x="{LEFT}" y="{top}" width="{WIDTH - LEFT - RIGHT}" height="{PANEL}" '
        'fill="none" stroke="#999"/>',
        f'<text x="4" y="{top + 12}">{label}</text>',
        f'<text x="4" y="{top + 26}" fill="#555">{hi:.4g}</text>',
        f'<text x="4" y="{top + PANEL - 2}" fill="#555">{lo:.4g}</text>',
    ]
    for a, b in log.outages():
        out.append(
            f'<rect x="{x_of(a):.1f}" y="{top}" width="{max(1.0, x_of(b) - x_of(a)):.1f}" '
            f'height="{PANEL}" fill="{OUTAGE}"><title>outage {b - a:.2f} s</title></rect>'
        )
    for p, pts in drawn.items():
        for run in _by_attempt(log, pts):  # no line across a restart
            coords = " ".join(
                f"{x_of(q[0]):.1f},{y_of(q[key]):.1f}" for q in run if math.isfinite(q[key])
            )
            out.append(
                f'<polyline points="{coords}" fill="none" stroke="{process_colour(p)}" '
                f'stroke-width="1.5"><title>p{p}</title></polyline>'
            )
    return out


def _by_attempt(log: TrainingLog, pts: list) -> list[list]:
    """``pts`` cut where the cell was sent again."""
    runs: dict[int, list] = {}
    for pt in pts:
        runs.setdefault(bisect.bisect_right(log.attempts, pt[0]), []).append(pt)
    return list(runs.values())


def _strip(r, i: int, top: float, scale: float) -> list[str]:
    """One fault's recovery: a bar from its last good step, one segment per phase."""
    out = [
        f'<text x="4" y="{top + 11}">fault {i}: {escape(r.what[:90])} '
        f"({r.kind}: {escape(format_procs(r.who))})</text>"
    ]
    x, prev = float(LEFT), 0.0
    for (name, ms), colour in zip(r.phases_ms(), PHASE_COLOURS, strict=True):
        if ms is None:
            continue
        w = max(1.0, (ms - prev) * scale)
        out.append(
            f'<rect x="{x:.1f}" y="{top + 15}" width="{w:.1f}" height="12" fill="{colour}">'
            f"<title>{name} +{ms:.0f} ms</title></rect>"
        )
        if w > 60:
            out.append(f'<text x="{x + 3:.1f}" y="{top + 25}" fill="#fff">+{ms:.0f} ms</text>')
        x, prev = x + w, ms
    return out


def training_svg(log: TrainingLog) -> str:
    """The picture: a title (goodput), loss and step per process over time, and a recovery
    strip per fault."""
    end = log.end if log.end is not None else log.clock()
    span = max(end - log.start, 1e-3)

    def x_of(t: float) -> float:
        return LEFT + (t - log.start) / span * (WIDTH - LEFT - RIGHT)

    faults = log.recoveries[:MAX_LINES]
    axis = 36 + 2 * (PANEL + 8) + 4
    height = axis + 6 + (22 + STRIP * len(faults) if faults else 0)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="4" y="14" font-weight="bold">{escape(summary_text(log).splitlines()[0])}</text>',
    ]
    x = LEFT
    for p in sorted(log.points)[:MAX_LINES]:
        out.append(f'<rect x="{x}" y="20" width="10" height="10" fill="{process_colour(p)}"/>')
        out.append(f'<text x="{x + 13}" y="29">p{p}</text>')
        x += 48
    out.append(f'<rect x="{x}" y="20" width="10" height="10" fill="{OUTAGE}"/>')
    out.append(f'<text x="{x + 13}" y="29">outage</text>')
    out += _panel(log, 36, 2, "loss", x_of)
    out += _panel(log, 36 + PANEL + 8, 1, "step", x_of)
    out.append(f'<text x="{LEFT}" y="{axis}">0 s</text>')
    out.append(f'<text x="{WIDTH - RIGHT}" y="{axis}" text-anchor="end">{span:.1f} s</text>')
    if faults:
        longest = max((ms or 0.0) for r in faults for _, ms in r.phases_ms()) or 1.0
        scale = (WIDTH - LEFT - RIGHT) / longest
        top = axis + 8
        x = LEFT
        for name, colour in zip(PHASES, PHASE_COLOURS, strict=True):
            out.append(f'<rect x="{x}" y="{top}" width="10" height="10" fill="{colour}"/>')
            out.append(f'<text x="{x + 13}" y="{top + 9}">{name}</text>')
            x += 110
        for i, r in enumerate(faults, 1):
            out += _strip(r, i, top + 14 + (i - 1) * STRIP, scale)
    out.append("</svg>")
    return "".join(out)


__all__ = ["fraction", "summary_text", "training_svg"]
