"""A data plan as text and as a static SVG, drawn from its summary dict.

These are the fallbacks of the plan view: the text goes in ``text/plain`` and the SVG in
``text/html``, so a saved notebook shows the plan on GitHub or in nbviewer, where widgets do
not render. The colours are the ones the sharding view gives each process
(``PALETTE`` matches ``processColour`` in ``widgets/static/shared.js``).
"""

from __future__ import annotations

from html import escape

from .._ranges import format_procs

# Same list, same order as PALETTE in widgets/static/shared.js (a test keeps them equal).
PALETTE = [
    "#8ec5ea",
    "#f7b26b",
    "#93d193",
    "#f19a9a",
    "#c3a8e0",
    "#d2ad9f",
    "#f2b6dd",
    "#c4c4c4",
    "#dede87",
    "#8fdbe5",
]
STRATEGY_TEXT = {
    "process": "one reader per process",
    "device": "one reader per device",
    "all": "every process reads everything",
}
# Process rows drawn in the SVG; the rest are counted.
MAX_ROWS = 16
MAP_W = 320
MINI_W = 120


def process_colour(p: int) -> str:
    """The colour of process ``p``, as the JavaScript views pick it."""
    if 0 <= p < len(PALETTE):
        return PALETTE[p]
    return f"hsl({round((p * 137.508) % 360)}, 55%, 72%)"


def format_ids(values, prefix: str = "p") -> str:
    """Sorted ids with runs collapsed: ``p0-3``, ``d0,2048``."""
    return format_procs(values, prefix)


def format_bytes(n: float) -> str:
    """Bytes in binary units: ``512 B``, ``8.0 KiB``."""
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    x, i = float(n), 0
    while x >= 1024 and i < len(units) - 1:
        x /= 1024
        i += 1
    return f"{int(x)} B" if i == 0 else f"{x:.1f} {units[i]}"


def _index_text(index: list) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in index) + "]"


def plan_text(s: dict) -> str:
    """The plan as a table: one row per process, then the reads of each process."""
    shape = s["shape"]
    head = (
        f"DataPlan {s['dtype']}[{', '.join(map(str, shape))}] ({format_bytes(s['nbytes'])})"
        f" · {s['sharding']} · {STRATEGY_TEXT.get(s['strategy'], s['strategy'])}"
    )
    rows = [("process", "devices", "reads", "runs", "bytes", "share", "same data as")]
    for p in s["processes"]:
        shared = sorted({q for r in p["reads"] for q in r["shared_with"]})
        share = p["nbytes"] / s["nbytes"] if s["nbytes"] else 0.0
        rows.append(
            (
                f"p{p['process']}",
                format_ids(p["devices"], prefix="d") if p["devices"] else "-",
                str(len(p["reads"])),
                str(p["runs"]),
                format_bytes(p["nbytes"]),
                f"{share:.1%}",
                format_ids(shared, prefix="p") if shared else "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [head]
    lines += [
        ("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))).rstrip()
        for r in rows
    ]
    amp = s["total_read"] / s["nbytes"] if s["nbytes"] else 0.0
    lines.append(f"  total read {format_bytes(s['total_read'])} = {amp:.2f} × the batch")
    for p in s["processes"]:
        parts = [
            f"{_index_text(r['index'])} -> {format_ids(r['devices'], prefix='d')}"
            for r in p["reads"][:4]
        ]
        more = len(p["reads"]) - 4
        lines.append(
            f"  p{p['process']} reads "
            + "; ".join(parts)
            + (f"; … {more} more" if more > 0 else "")
        )
    return "\n".join(lines)


def _grid(s: dict, width: float) -> tuple[list[int], list[int], float, float]:
    """Row and column edges drawn (dims 0 and 1), and the drawing's size."""
    shape, edges = s["shape"], s["edges"]
    rows = edges[0] if len(shape) >= 2 else [0, 1]
    cols = edges[1] if len(shape) >= 2 else (edges[0] if shape else [0, 1])
    nr = (shape[0] if len(shape) >= 2 else 1) or 1
    nc = (shape[1] if len(shape) >= 2 else (shape[0] if shape else 1)) or 1
    height = 28.0 if len(shape) < 2 else max(28.0, min(width * nr / nc, 220.0))
    return rows, cols, width, height


def _cell_xy(index: list, s: dict, rows, cols, w: float, h: float):
    """Pixel box of an index range (only dims 0 and 1 are drawn)."""
    shape = s["shape"]
    if len(shape) >= 2:
        (r0, r1), (c0, c1) = index[0], index[1]
    else:
        r0, r1 = 0, 1
        c0, c1 = index[0] if shape else (0, 1)
    span_r = (rows[-1] - rows[0]) or 1
    span_c = (cols[-1] - cols[0]) or 1
    x0, x1 = c0 / span_c * w, c1 / span_c * w
    y0, y1 = r0 / span_r * h, r1 / span_r * h
    return x0, y0, x1 - x0, y1 - y0


def _first_along_rest(index: list) -> bool:
    """Whether a box is the first along every dim past the two drawn ones."""
    return all(a == 0 for a, _ in index[2:])


def _main_map(s: dict, ox: float, oy: float) -> tuple[list[str], float]:
    rows, cols, w, h = _grid(s, MAP_W)
    out = [f'<g transform="translate({ox},{oy})">']
    for b in s["blocks"]:
        if not _first_along_rest(b["index"]):
            continue
        x, y, bw, bh = _cell_xy(b["index"], s, rows, cols, w, h)
        readers = b["readers"][:4] or [0]
        for k, p in enumerate(readers):
            out.append(
                f'<rect x="{x + bw * k / len(readers):.1f}" y="{y:.1f}" '
                f'width="{bw / len(readers):.1f}" height="{bh:.1f}" fill="{process_colour(p)}"/>'
            )
        label = format_ids(b["readers"], prefix="p")
        tip = f"{_index_text(b['index'])} held by {len(b['holders'])} device(s), read by {label}"
        out.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw:.1f}" height="{bh:.1f}" fill="none" '
            f'stroke="#333" stroke-width="0.6"><title>{escape(tip)}</title></rect>'
        )
        if bw >= 7 * len(label) + 6 and bh >= 14:
            out.append(
                f'<text x="{x + bw / 2:.1f}" y="{y + bh / 2 + 4:.1f}" text-anchor="middle">'
                f"{escape(label)}</text>"
            )
    out.append("</g>")
    return out, h


def _process_row(s: dict, p: dict, oy: float, bar_max: int) -> list[str]:
    rows, cols, w, h = _grid(s, MINI_W)
    scale = min(1.0, 36.0 / h) if h else 1.0
    h *= scale
    colour = process_colour(p["process"])
    out = [f'<g transform="translate(0,{oy})">']
    out.append(f'<text x="0" y="{h / 2 + 4:.1f}">p{p["process"]}</text>')
    out.append(
        f'<rect x="28" y="0" width="{w}" height="{h:.1f}" fill="#f4f4f4" stroke="#999" '
        'stroke-width="0.6"/>'
    )
    for r in p["reads"]:
        if not _first_along_rest(r["index"]):
            continue
        x, y, rw, rh = _cell_xy(r["index"], s, rows, cols, w, h / scale)
        out.append(
            f'<rect x="{28 + x:.1f}" y="{y * scale:.1f}" width="{rw:.1f}" '
            f'height="{rh * scale:.1f}" fill="{colour}" stroke="#333" stroke-width="0.8">'
            f"<title>{escape(_index_text(r['index']))}: {format_bytes(r['nbytes'])}</title></rect>"
        )
    bar = 160 * p["nbytes"] / bar_max if bar_max else 0
    x0 = 28 + w + 12
    out.append(
        f'<rect x="{x0}" y="{h / 2 - 6:.1f}" width="{max(bar, 1):.1f}" height="12" '
        f'fill="{colour}" stroke="#333" stroke-width="0.6"/>'
    )
    share = p["nbytes"] / s["nbytes"] if s["nbytes"] else 0.0
    n = len(p["reads"])
    out.append(
        f'<text x="{x0 + 168}" y="{h / 2 + 4:.1f}">{format_bytes(p["nbytes"])} ({share:.0%})'
        f" · {n} read{'' if n == 1 else 's'}, {p['runs']} run{'' if p['runs'] == 1 else 's'}"
        "</text>"
    )
    out.append("</g>")
    return out


def plan_svg(s: dict) -> str:
    """The plan as a self-contained SVG (inside a ``div``), for ``text/html``.

    The map shows the global batch (dims 0 and 1) split into the devices' blocks, each
    coloured by the processes that read it; below, one row per process shows the slices it
    reads and a bar of its bytes.
    """
    title = escape(plan_text(s).splitlines()[0])
    amp = s["total_read"] / s["nbytes"] if s["nbytes"] else 0.0
    body, h = _main_map(s, 0, 22)
    y = 22 + h + 14
    parts = [
        f'<text x="0" y="14" font-weight="bold">{title}</text>',
        *body,
        f'<text x="0" y="{y:.1f}">read in total: {format_bytes(s["total_read"])} '
        f"= {amp:.2f} × the batch</text>",
    ]
    y += 10
    bar_max = max((p["nbytes"] for p in s["processes"]), default=0)
    for p in s["processes"][:MAX_ROWS]:
        _, _, _, mh = _grid(s, MINI_W)
        mh = min(mh, 36.0)
        parts += _process_row(s, p, y, bar_max)
        y += mh + 6
    more = len(s["processes"]) - MAX_ROWS
    if more > 0:
        parts.append(f'<text x="0" y="{y + 12:.1f}">… {more} more processes</text>')
        y += 18
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="640" height="{y + 6:.0f}" '
        'font-family="sans-serif" font-size="11">' + "".join(parts) + "</svg>"
    )
    return f'<div class="jaxsys-dataplan">{svg}</div>'
