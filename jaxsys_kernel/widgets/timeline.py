"""The timeline view: what every process ran, on one time axis.

It draws a ``timeline`` summary (:func:`jaxsys_kernel.cells.timeline.summary`): one row per
process with its executables (blue), collectives (orange) and the cell lines they came from
(grey, thin, above); wheel to zoom, drag to pan, hover for name and duration. The slowest
process (most time in executables) is marked, so the processes that wait for it in each
collective stand out. For where widgets do not run (untrusted notebooks, nbconvert,
GitHub), the mime bundle also carries the same drawing as ``image/png`` and one line per
process as ``text/plain``, as the other views do (see :mod:`.fallback` for why PNG);
:func:`timeline_svg` draws it as SVG, with each span's name and duration as its tooltip.

This module never imports JAX.
"""

from __future__ import annotations

import html
import pathlib
from typing import Any

import anywidget
import traitlets

from .fallback import png_bundle
from .kinds import check_kind
from .pictures import stack, text_picture
from .raster import CHAR_H, LINE_H, Canvas, fit, text_width
from .unstored import Unstored

_STATIC = pathlib.Path(__file__).parent / "static"
COLOURS = {"executable": "#4e8fd6", "collective": "#f08a24", "line": "#b0b0b0"}
ROW, WIDTH, LEFT = 34, 900, 60
# The picture's margin, and the gap between a process's label and its row of spans.
MARGIN, GAP = 6, 8
LEGEND = (("executable", "executables"), ("collective", "collectives"), ("line", "cell lines"))


# Starts closer than this (microseconds) are the same moment: clocks are corrected only
# to about this much.
SAME_START_US = 50.0


def slowest(info: dict) -> int | None:
    """The process the others waited for.

    At each collective (or, in a trace without collectives, each executable) the process
    that started it last is the one the others waited for; the process that was last most
    often is named. Where every process starts together, the one that spent the most time
    in executables is named instead (the others wait for it inside the next collective).
    """
    procs = info.get("processes") or []
    if not procs:
        return None
    votes: dict[int, int] = {}
    for starts in zip(*(_arrivals(p) for p in procs), strict=False):
        last = max(range(len(procs)), key=lambda i: starts[i])
        if starts[last] - min(starts) > SAME_START_US:
            votes[procs[last]["rank"]] = votes.get(procs[last]["rank"], 0) + 1
    if votes:
        return max(votes, key=lambda rank: votes[rank])
    return max(procs, key=lambda p: p["executable_us"])["rank"]


def _arrivals(process: dict) -> list[float]:
    spans = process.get("spans") or []
    kind = "collective" if any(s["kind"] == "collective" for s in spans) else "executable"
    return [s["start"] for s in spans if s["kind"] == kind]


def timeline_svg(info: dict) -> str:
    """The summary drawn as a static SVG (what the view shows before any zoom)."""
    procs = info.get("processes") or []
    end = max(info.get("end_us") or 0.0, 1.0)
    scale = (WIDTH - LEFT - 10) / end
    height = ROW * len(procs) + 30
    late = slowest(info)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        'font-family="sans-serif" font-size="11">'
    ]
    for i, p in enumerate(procs):
        y = 10 + i * ROW
        mark = " (slowest)" if p["rank"] == late and len(procs) > 1 else ""
        parts.append(f'<text x="2" y="{y + 18}">p{p["rank"]}{mark}</text>')
        for s in p["spans"]:
            x, w = LEFT + s["start"] * scale, max(s["dur"] * scale, 0.5)
            top, h = (y, 6) if s["kind"] == "line" else (y + 8, 18)
            title = html.escape(f"p{p['rank']} {s['name']}: {s['dur'] / 1e3:.3f} ms")
            parts.append(
                f'<rect x="{x:.1f}" y="{top}" width="{w:.1f}" height="{h}" '
                f'fill="{COLOURS[s["kind"]]}"><title>{title}</title></rect>'
            )
    parts.append(
        f'<text x="{LEFT}" y="{height - 6}">0 to {end / 1e3:.1f} ms on the kernel\'s clock; '
        "blue: executables, orange: collectives, grey: cell lines</text></svg>"
    )
    return "".join(parts)


def _row_label(rank: int, late: int | None, many: bool) -> str:
    return f"p{rank} (slowest)" if rank == late and many else f"p{rank}"


def _draw_row(canvas: Canvas, p: dict, y: int, left: int, scale: float) -> None:
    """One process's spans: cell lines thin above, executables and collectives below, the
    name written inside a span wide enough for it."""
    for s in sorted(p["spans"], key=lambda s: s["kind"] != "line"):
        x, w = left + s["start"] * scale, max(s["dur"] * scale, 1.0)
        if s["kind"] == "line":
            canvas.box(x, y, w, 6, fill=COLOURS["line"])
            continue
        canvas.box(x, y + 8, w, 22, fill=COLOURS[s["kind"]])
        if text_width(s["name"]) <= w - 4:
            canvas.text(x + 2, y + 8 + (22 - CHAR_H) / 2, s["name"], "#ffffff")


def timeline_picture(info: dict) -> Canvas:
    """The summary drawn as a picture: a title, a row per process, the axis and a legend.

    Parameters
    ----------
    info : dict
        A ``timeline`` summary (:func:`jaxsys_kernel.cells.timeline.summary`).

    Returns
    -------
    Canvas
        The drawing, with :func:`timeline_text` below it.
    """
    procs = info.get("processes") or []
    end = max(info.get("end_us") or 0.0, 1.0)
    late = slowest(info)
    labels = [_row_label(p["rank"], late, len(procs) > 1) for p in procs]
    left = MARGIN + max(map(text_width, labels), default=0) + GAP
    scale = (WIDTH - left - MARGIN) / end
    top = MARGIN + LINE_H
    canvas = Canvas(WIDTH, top + ROW * len(procs) + 2 * LINE_H + MARGIN)
    title = f"{len(procs)} processes, 0 to {end / 1e3:.1f} ms on the kernel's clock"
    canvas.text(MARGIN, MARGIN, fit(title, WIDTH - 2 * MARGIN))
    for i, (p, label) in enumerate(zip(procs, labels, strict=True)):
        y = top + i * ROW
        canvas.text(MARGIN, y + 8 + (22 - CHAR_H) / 2, label)
        _draw_row(canvas, p, y, left, scale)
    x, y = MARGIN, top + ROW * len(procs) + LINE_H
    for kind, words in LEGEND:
        canvas.box(x, y, CHAR_H, CHAR_H, fill=COLOURS[kind])
        canvas.text(x + CHAR_H + 4, y, words, "#555555")
        x += CHAR_H + 4 + text_width(words) + 16
    return stack([[canvas], [text_picture(timeline_text(info))]], gap=0)


def timeline_text(info: dict) -> str:
    """One line per process: time in executables and the longest of them."""
    lines = []
    for p in info.get("processes") or []:
        longest = max(
            (s for s in p["spans"] if s["kind"] != "line"), key=lambda s: s["dur"], default=None
        )
        what = f"; longest {longest['name']} {longest['dur'] / 1e3:.3f} ms" if longest else ""
        lines.append(f"p{p['rank']}: {p['executable_us'] / 1e3:.3f} ms in executables{what}")
    return "\n".join(lines) or "<empty timeline>"


class TimelineView(Unstored, anywidget.AnyWidget):
    """Every process's executables and collectives on one time axis.

    Parameters
    ----------
    info : dict, optional
        A ``timeline`` summary dict.
    **kwargs
        Passed to ``anywidget.AnyWidget``.

    Examples
    --------
    >>> view = TimelineView({"kind": "timeline", "end_us": 10.0, "processes": []})
    >>> view.text()
    '<empty timeline>'
    """

    _esm = _STATIC / "timeline.js"
    info = traitlets.Dict().tag(sync=True)

    def __init__(self, info: dict | None = None, **kwargs: Any) -> None:
        super().__init__(info=info or {}, **kwargs)

    @traitlets.validate("info")
    def _valid_info(self, proposal: Any) -> dict:
        info = check_kind(proposal["value"], "timeline", "TimelineView", missing_ok=False)
        if info.get("processes"):
            # The page marks the same process as the pictures (one rule, decided here).
            info = {**info, "late": slowest(info)}
        return info

    def text(self) -> str:
        """The timeline as one line per process."""
        return timeline_text(self.info)

    def _repr_mimebundle_(self, **kwargs: Any):
        bundle = super()._repr_mimebundle_(**kwargs)
        data, metadata = bundle if isinstance(bundle, tuple) else (bundle or {}, {})
        data = {k: v for k, v in data.items() if not k.startswith("text/")}
        if self.info.get("processes"):
            return {**data, **png_bundle(timeline_picture(self.info), self.text())}, metadata
        return {**data, "text/plain": self.text()}, metadata


__all__ = ["TimelineView", "slowest", "timeline_picture", "timeline_svg", "timeline_text"]
