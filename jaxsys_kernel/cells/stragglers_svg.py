"""The straggler view as a static SVG picture, kept in saved notebooks.

One stacked bar per listed process (the same processes as the text view): its mean time
per step in input, host, compile, compute and waiting for the others.
"""

from __future__ import annotations

from html import escape

from .stragglers import PARTS, Stragglers
from .stragglers_view import TOP

WIDTH = 640
ROW = 18
LEFT = 60
COLOURS = {
    "input": "#9467bd",
    "host": "#ff7f0e",
    "compile": "#d62728",
    "compute": "#1f77b4",
    "wait": "#c7c7c7",
}


def where_svg(view: Stragglers, top: int = TOP) -> str:
    """The picture: a title (the verdict), a legend, and one bar per listed process."""
    means = view.breakdown()
    order = sorted(means, key=lambda r: (means[r]["wait"], r))[:top]
    total = max((sum(means[r].values()) for r in order), default=0.0) or 1.0
    scale = (WIDTH - LEFT - 10) / total
    named = view.named()
    title = f"p{named[0]} held the others up, in {named[1]}" if named else "no straggler"
    height = 48 + ROW * len(order)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="4" y="14" font-weight="bold">{escape(title)} '
        f"({len(view.findings)} steps; mean per step)</text>",
    ]
    x = LEFT
    for part in PARTS:
        out.append(f'<rect x="{x}" y="20" width="10" height="10" fill="{COLOURS[part]}"/>')
        out.append(f'<text x="{x + 13}" y="29">{part}</text>')
        x += 80
    for i, r in enumerate(order):
        y = 38 + i * ROW
        out.append(f'<text x="4" y="{y + 12}">p{r}</text>')
        x = float(LEFT)
        for part in PARTS:
            w = means[r][part] * scale
            if w > 0:
                ms = means[r][part] * 1e3
                out.append(
                    f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{ROW - 4}" '
                    f'fill="{COLOURS[part]}"><title>p{r} {part} {ms:.1f} ms</title></rect>'
                )
            x += w
    out.append("</svg>")
    return "".join(out)


__all__ = ["where_svg"]
