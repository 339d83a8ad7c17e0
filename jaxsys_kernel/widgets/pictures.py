"""The mesh and sharding views as PNG pictures, for notebooks read where widgets do not run.

Each picture has a title line, a caption that says what rows and columns are for the array's
rank, the grid itself (sized to its content, as the live views are) and a legend of process
colours. See :mod:`.raster` for why PNG.

This module never imports JAX.
"""

from __future__ import annotations

from ..data.draw import format_ids, plan_text, process_colour
from .raster import CHAR_H, CHAR_W, LINE_H, Canvas, fit, text_width

MARGIN = 6
EDGE = "#333333"
MUTED = "#555555"
# A block's or cell's preferred size: two short labels and a badge fit. Same rule as
# static/sharding.js (plotSize), in pixels of this picture.
BLOCK_W, BLOCK_H, MIN_BLOCK_H = 96, 52, 30
MAX_W, MAX_H = 760, 480
CELL = 56
MAX_LEGEND = 16


def _height_of_lines(n: int) -> int:
    return n * LINE_H


def _legend(canvas: Canvas, x: int, y: int, processes: list[int]) -> None:
    for p in processes[:MAX_LEGEND]:
        canvas.box(x, y, CHAR_H, CHAR_H, fill=process_colour(p), edge=EDGE)
        label = f"p{p}"
        canvas.text(x + CHAR_H + 4, y, label)
        x += CHAR_H + 4 + text_width(label) + 10
        if x > canvas.width - 60:
            break
    more = len(processes) - MAX_LEGEND
    if more > 0:
        canvas.text(x, y, f"+{more} more", MUTED)


def wrap(line: str, width: float) -> list[str]:
    """``line`` broken at its " · " separators into lines of at most ``width`` pixels."""
    out: list[str] = []
    for part in line.split(" · "):
        if out and text_width(f"{out[-1]} · {part}") <= width:
            out[-1] += f" · {part}"
        else:
            out.append(part)
    return out


def _canvas(lines: list[str], grid_w: float, grid_h: float, legend: bool, left: int = 0):
    """A canvas wide enough for the text lines and the grid, with the lines drawn on top."""
    room = max(grid_w + left, MAX_W)
    lines = [w for line in lines for w in wrap(line, room)]
    width = max(grid_w + left, *(text_width(t) for t in lines)) + 2 * MARGIN
    width = min(width, room + 2 * MARGIN)
    height = _height_of_lines(len(lines)) + grid_h + LINE_H * (1 + legend) + MARGIN
    canvas = Canvas(int(width), int(height))
    for i, line in enumerate(lines):
        colour = "#111111" if i == 0 else MUTED
        canvas.text(MARGIN, MARGIN + i * LINE_H, fit(line, width - 2 * MARGIN), colour)
    return canvas, MARGIN + _height_of_lines(len(lines)) + 4


# -- mesh ---------------------------------------------------------------------------------


def mesh_caption(info: dict) -> list[str]:
    """The mesh picture's title and caption lines."""
    names, shape = info["axis_names"], info["shape"]
    n, procs = len(info["devices"]), len(info["processes"])
    axes = " × ".join(f"{a}={s}" for a, s in zip(names, shape, strict=True)) or "no axes"
    title = f"Mesh {axes} · {n} device{'s' * (n != 1)} on {procs} process{'es' * (procs != 1)}"
    if len(shape) == 0:
        return [title, "one device"]
    if len(shape) == 1:
        return [title, f"columns: {names[0]}"]
    what = f"rows: {names[-2]} · columns: {names[-1]}"
    if len(shape) > 2:
        what += f" · one panel per {', '.join(names[:-2])}"
    return [title, what]


def _panels(info: dict) -> tuple[int, int, list[str]]:
    shape, names = info["shape"], info["axis_names"]
    rows = shape[-2] if len(shape) >= 2 else 1
    cols = shape[-1] if shape else 1
    labels = [""]
    for a in range(len(shape) - 2):
        labels = [
            f"{lab}{', ' * bool(lab)}{names[a]}={i}" for lab in labels for i in range(shape[a])
        ]
    return rows, cols, labels


def mesh_picture(info: dict) -> Canvas:
    """The mesh as a picture: one cell per device, coloured by process, labelled when it fits.

    Parameters
    ----------
    info : dict
        A MeshInfo dict (:func:`jaxsys_kernel.engine.summaries.mesh_info`), not empty.

    Returns
    -------
    Canvas
        Its :meth:`~.raster.Canvas.png` is the PNG.
    """
    rows, cols, labels = _panels(info)
    per_row = max(1, min(len(labels), MAX_W // (cols * 8 + 12)))
    # Wide enough for the longest device label (ids of later processes run to thousands).
    label_w = max(text_width(f"d{d}") for d in info["devices"]) + 8
    cell = max(2, min(max(CELL, label_w), (MAX_W // per_row - 12) // cols))
    panel_w, label_h = cols * cell + 12, LINE_H if len(labels) > 1 else 0
    panel_h = rows * cell + label_h + 8
    n_rows = -(-len(labels) // per_row)
    canvas, top = _canvas(mesh_caption(info), per_row * panel_w, n_rows * panel_h, True)
    for k, label in enumerate(labels):
        x0 = MARGIN + (k % per_row) * panel_w
        y0 = top + (k // per_row) * panel_h
        if label:
            canvas.text(x0, y0, fit(label, panel_w), MUTED)
        for i in range(rows * cols):
            flat = k * rows * cols + i
            x, y = x0 + (i % cols) * cell, y0 + label_h + (i // cols) * cell
            proc = info["process"][flat]
            canvas.box(x, y, cell - 1, cell - 1, fill=process_colour(proc),
                       edge=EDGE if cell >= 6 else None)  # fmt: skip
            if cell >= 4 * CHAR_W // 2 + 8 and cell >= 2 * LINE_H:
                canvas.text(x + cell / 2, y + cell / 2 - LINE_H / 2 + 2,
                            fit(f"d{info['devices'][flat]}", cell - 4), centre=True)  # fmt: skip
                canvas.text(x + cell / 2, y + cell / 2 + LINE_H / 2 - 2,
                            fit(f"p{proc}", cell - 4), centre=True)  # fmt: skip
    _legend(canvas, MARGIN, canvas.height - LINE_H - MARGIN + 4, info["processes"])
    return canvas


# -- sharding -----------------------------------------------------------------------------


def drawn_dims(ndim: int, dims=(0, 1)) -> tuple[int | None, int | None]:
    """(row dim, column dim) drawn for an array of rank ``ndim``; None where there is none."""
    if ndim == 0:
        return None, None
    if ndim == 1:
        return None, 0
    r, c = dims if len(dims) == 2 else (0, 1)
    r = r if 0 <= r < ndim else 0
    c = c if 0 <= c < ndim and c != r else (1 if r == 0 else 0)
    return r, c


def sharding_caption(info: dict, dims=(0, 1)) -> list[str]:
    """The sharding picture's title and caption lines, right for every rank."""
    shape = list(info["shape"])
    mesh = info.get("mesh")
    title = f"{info.get('dtype') or 'array'}[{', '.join(map(str, shape))}]"
    spec = info.get("spec_repr") or info.get("sharding") or ""
    if spec and len(spec) <= 60:
        title += f" · {spec}"
    if mesh:
        title += " · mesh " + " × ".join(
            f"{a}={s}" for a, s in zip(mesh["axis_names"], mesh["shape"], strict=True)
        )
    n, procs, rep = info["num_devices"], len(info["processes"]), info.get("replicas", 1)
    held = f"{n} device{'s' * (n != 1)} on {procs} process{'es' * (procs != 1)}"
    if not shape:
        return [title, f"a scalar: one value, held by {held}"]
    blocks = f"{info['num_blocks']} block{'s' * (info['num_blocks'] != 1)}"
    blocks += f" of [{', '.join(map(str, info['shard_shape']))}]"
    if rep > 1:
        blocks += f", each on {rep} devices"
    r, c = drawn_dims(len(shape), dims)
    if r is None:
        what = f"dim 0 ({shape[0]}) across"
    else:
        what = f"rows: dim {r} ({shape[r]}) · columns: dim {c} ({shape[c]})"
        others = [d for d in range(len(shape)) if d not in (r, c)]
        if others:
            what += f" · dims {', '.join(map(str, others))}: first block shown"
    return [title, f"{blocks} · {held}", what]


def plot_size(
    rows_blocks: int, cols_blocks: int, rows_n, cols_n: int, block_w: int = BLOCK_W
) -> tuple[int, int]:
    """The grid's size: what its blocks need, as ``plotSize`` in ``static/sharding.js``.

    ``block_w`` widens the blocks for long device labels (real device ids run to thousands).
    """
    w = max(120, min(cols_blocks * max(block_w, BLOCK_W), MAX_W))
    if rows_n is None:
        return w, BLOCK_H
    wanted = w * rows_n / cols_n
    h = max(rows_blocks * MIN_BLOCK_H, min(rows_blocks * BLOCK_H, wanted))
    return w, round(max(48, min(MAX_H, h)))


def _device_label(block: dict) -> str:
    return format_ids(sorted({h[0] for h in block["holders"]}), "d")


def sharding_picture(info: dict, dims=(0, 1)) -> Canvas:
    """The sharding as a picture: the drawn dims' blocks, each striped by the processes holding it.

    Parameters
    ----------
    info : dict
        A ShardingInfo dict (:func:`jaxsys_kernel.engine.summaries.sharding_info`), not empty.
    dims : tuple of int
        The array dims drawn as rows and columns (arrays of rank 3 and more).

    Returns
    -------
    Canvas
        Its :meth:`~.raster.Canvas.png` is the PNG.
    """
    shape = list(info["shape"])
    r, c = drawn_dims(len(shape), dims)
    row_edges = info["edges"][r] if r is not None else [0, 1]
    col_edges = info["edges"][c] if c is not None else [0, 1]
    shown = [b for b in info["blocks"] if not any(
        b["cell"][d] for d in range(len(b["cell"])) if d not in (r, c))]  # fmt: skip
    label_w = max((text_width(_device_label(b)) for b in shown[:256]), default=0) + 10
    w, h = plot_size(len(row_edges) - 1, len(col_edges) - 1,
                     None if r is None else shape[r] or 1, shape[c] or 1 if c is not None else 1,
                     label_w)  # fmt: skip
    canvas, top = _canvas(sharding_caption(info, dims), w, h, True)

    def at(edges: list[int], v: int, size: int) -> float:
        return (v - edges[0]) / ((edges[-1] - edges[0]) or 1) * size

    for b in info["blocks"]:
        cell = list(b["cell"])
        if any(cell[d] for d in range(len(cell)) if d not in (r, c)):
            continue  # along the dims not drawn, only the first blocks, as the caption says
        ri = cell[r] if r is not None else 0
        ci = cell[c] if c is not None else 0
        x0, x1 = at(col_edges, col_edges[ci], w), at(col_edges, col_edges[ci + 1], w)
        y0, y1 = at(row_edges, row_edges[ri], h), at(row_edges, row_edges[ri + 1], h)
        x0, x1, y0, y1 = x0 + MARGIN, x1 + MARGIN, y0 + top, y1 + top
        procs = b["addressable_by"] or [None]
        share = (x1 - x0) / len(procs[:4])
        for k, p in enumerate(procs[:4]):
            fill = "#dddddd" if p is None else process_colour(p)
            canvas.box(x0 + k * share, y0, share + 1, y1 - y0, fill=fill)
        canvas.box(x0, y0, x1 - x0 + 1, y1 - y0 + 1, edge=EDGE)
        _block_labels(canvas, b, x0, y0, x1 - x0, y1 - y0)
    _legend(canvas, MARGIN, canvas.height - LINE_H - MARGIN + 4, info["processes"])
    return canvas


def _block_labels(canvas: Canvas, b: dict, x: float, y: float, w: float, h: float) -> None:
    """Device and process labels, each only where it fits; else counts; else nothing."""
    if w < 3 * CHAR_W + 6 or h < CHAR_H + 4:
        return  # not even a count fits: the colours and the legend say it all
    lines = [_device_label(b), format_ids(b["addressable_by"])]
    shorts = [f"{b['n_holders']} dev", f"{len(b['addressable_by'])} proc"]
    if b.get("replicas", 1) > 1:
        lines[1] += f" ×{b['replicas']}"
    room = w - 6
    shown = [t if text_width(t) <= room else s if text_width(s) <= room else ""
             for t, s in zip(lines, shorts, strict=True)]  # fmt: skip
    step = CHAR_H + 4
    shown = [t for t in shown if t][: max(0, int((h - 4) // step))]
    for i, t in enumerate(shown):
        canvas.text(x + w / 2, y + h / 2 + (i - (len(shown) - 1) / 2) * step, t, centre=True)


# -- data plan ----------------------------------------------------------------------------

PLAN_W = 320


def _plan_box(index: list, shape: list, rows: list, cols: list, w: float, h: float):
    """Pixel box of an index range of the batch (dims 0 and 1 drawn, else dim 0 across)."""
    if len(shape) >= 2:
        (r0, r1), (c0, c1) = index[0], index[1]
    else:
        (r0, r1), (c0, c1) = (0, 1), (index[0] if shape else (0, 1))
    sr, sc = (rows[-1] - rows[0]) or 1, (cols[-1] - cols[0]) or 1
    return c0 / sc * w, r0 / sr * h, (c1 - c0) / sc * w, (r1 - r0) / sr * h


def dataplan_picture(s: dict) -> Canvas:
    """A data-loading plan: the batch's blocks coloured by their readers, then its table.

    Parameters
    ----------
    s : dict
        A ``dataplan`` summary (:meth:`jaxsys_kernel.data.planner.DataPlan.summary`).

    Returns
    -------
    Canvas
    """
    shape, edges = list(s["shape"]), s["edges"]
    rows = edges[0] if len(shape) >= 2 else [0, 1]
    cols = edges[1] if len(shape) >= 2 else (edges[0] if shape else [0, 1])
    w = PLAN_W
    h = BLOCK_H if len(shape) < 2 else max(BLOCK_H, min(w * (shape[0] or 1) / (shape[1] or 1), 240))
    text = plan_text(s).splitlines()
    what = "rows: dim 0 · columns: dim 1" if len(shape) >= 2 else "dim 0 across"
    canvas, top = _canvas([text[0], f"{what} · colours: the processes that read each block"],
                          w, h, True)  # fmt: skip
    for b in s["blocks"]:
        if any(a for a, _ in b["index"][2:]):
            continue  # only the first block along the dims not drawn
        x, y, bw, bh = _plan_box(b["index"], shape, rows, cols, w, h)
        x, y = x + MARGIN, y + top
        readers = b["readers"][:4] or [None]
        for k, p in enumerate(readers):
            fill = "#dddddd" if p is None else process_colour(p)
            canvas.box(x + bw * k / len(readers), y, bw / len(readers) + 1, bh, fill=fill)
        canvas.box(x, y, bw + 1, bh + 1, edge=EDGE)
        label = format_ids(b["readers"])
        if text_width(label) <= bw - 4 and bh >= CHAR_H + 2:
            canvas.text(x + bw / 2, y + bh / 2, label, centre=True)
    _legend(
        canvas, MARGIN, canvas.height - LINE_H - MARGIN + 4, [p["process"] for p in s["processes"]]
    )
    return stack([[canvas], [text_picture("\n".join(text[1:]))]], gap=0)


# -- several at once ----------------------------------------------------------------------


def text_picture(text: str) -> Canvas:
    """Lines of text (an aligned text table, say) as a picture."""
    lines = text.splitlines() or [""]
    canvas = Canvas(max(map(text_width, lines)) + 2 * MARGIN, len(lines) * LINE_H + 2 * MARGIN)
    for i, line in enumerate(lines):
        canvas.text(MARGIN, MARGIN + i * LINE_H, line)
    return canvas


def stack(rows: list[list[Canvas]], gap: int = 12) -> Canvas:
    """Pictures placed in rows, left to right and top to bottom."""
    widths = [sum(c.width for c in row) + gap * (len(row) - 1) for row in rows]
    heights = [max(c.height for c in row) for row in rows]
    out = Canvas(max(widths), sum(heights) + gap * (len(rows) - 1))
    y = 0
    for row, h in zip(rows, heights, strict=True):
        x = 0
        for c in row:
            out.pixels[y : y + c.height, x : x + c.width] = c.pixels
            x += c.width + gap
        y += h + gap
    return out
