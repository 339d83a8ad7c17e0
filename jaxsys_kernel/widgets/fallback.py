"""Static renderings of the views, for where widgets do not run.

GitHub, nbconvert and terminals show a saved notebook's ``text/html`` and ``text/plain``
outputs but never run the views' JavaScript. Each view therefore also puts in its mime
bundle an HTML rendering of the same picture (inline SVG for the mesh and the sharding,
tables for the cache and liveness) and a short text summary. Process colours are those of
the live views (:data:`jaxsys_kernel.data.draw.PALETTE`).

This module never imports JAX.
"""

from __future__ import annotations

from html import escape

from ..data.draw import format_ids, process_colour
from ..telemetry.schema import transfer_counts_text

# Largest SVG cell grid drawn; bigger meshes and layouts are summarised in text only.
MAX_CELLS = 4096
CELL = 44.0


def _svg(width: float, height: float, body: list[str], title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'font-family="sans-serif" font-size="10"><title>{escape(title)}</title>'
        + "".join(body)
        + "</svg>"
    )


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{escape(caption)}</figcaption></figure>"


# -- mesh ---------------------------------------------------------------------------------


def mesh_text(info: dict) -> str:
    """One line naming the mesh's axes, size, processes and devices.

    Parameters
    ----------
    info : dict
        A MeshInfo dict (:func:`jaxsys_kernel.engine.summaries.mesh_info`); empty for none.

    Returns
    -------
    str
    """
    if not info:
        return "<empty mesh>"
    axes = ", ".join(f"{a}={n}" for a, n in zip(info["axis_names"], info["shape"], strict=True))
    return (
        f"Mesh({axes}): {info['num_devices']} devices of processes "
        f"{format_ids(info['processes'])}; devices {info['devices']}"
    )


def _mesh_grid(info: dict) -> tuple[int, int]:
    shape = info["shape"] or [1]
    cols = shape[-1]
    rows = 1
    for n in shape[:-1]:
        rows *= n
    return rows, cols


def mesh_svg(info: dict) -> str:
    """The mesh as a grid of device cells coloured by process (leading axes stacked).

    Parameters
    ----------
    info : dict
        A MeshInfo dict; meshes of more than :data:`MAX_CELLS` devices get text instead.

    Returns
    -------
    str
        HTML: a ``<figure>`` holding an inline SVG and a caption.
    """
    if not info:
        return "<p>empty mesh</p>"
    rows, cols = _mesh_grid(info)
    if rows * cols > MAX_CELLS:
        return f"<pre>{escape(mesh_text(info))}</pre>"
    body = []
    for i, (dev, proc) in enumerate(zip(info["devices"], info["process"], strict=True)):
        x, y = (i % cols) * CELL, (i // cols) * CELL
        body.append(
            f'<rect x="{x + 1:.0f}" y="{y + 1:.0f}" width="{CELL - 2:.0f}" '
            f'height="{CELL - 2:.0f}" fill="{process_colour(proc)}" stroke="#333"/>'
            f'<text x="{x + CELL / 2:.0f}" y="{y + CELL / 2 - 2:.0f}" text-anchor="middle">'
            f"d{dev}</text>"
            f'<text x="{x + CELL / 2:.0f}" y="{y + CELL / 2 + 10:.0f}" text-anchor="middle">'
            f"p{proc}</text>"
        )
    axes = " x ".join(info["axis_names"])
    svg = _svg(cols * CELL, rows * CELL, body, mesh_text(info))
    return _figure(svg, f"mesh {axes}: rows run over the leading axes, columns over the last")


# -- sharding -----------------------------------------------------------------------------


def sharding_text(info: dict) -> str:
    """The shape, spec, shard shape and replication, then the first blocks' holders.

    Parameters
    ----------
    info : dict
        A ShardingInfo dict (:func:`jaxsys_kernel.engine.summaries.sharding_info`).

    Returns
    -------
    str
        One line, plus one line naming the devices and processes of up to 8 blocks.
    """
    if not info:
        return "<empty sharding>"
    owners = "; ".join(
        f"{_block_index(b)} on {format_ids(sorted({h[0] for h in b['holders']}), 'd')} "
        f"({format_ids(b['addressable_by'])})"
        for b in info.get("blocks", [])[:8]
    )
    more = " ..." if len(info.get("blocks", [])) > 8 else ""
    return (
        f"{info.get('spec_repr') or info.get('sharding')} over shape {tuple(info['shape'])}: "
        f"{info['num_blocks']} blocks of shape {tuple(info['shard_shape'])}, "
        f"x{info['replicas']} replicated, processes {format_ids(info['processes'])}"
        + (f"\n{owners}{more}" if owners else "")
    )


def _block_index(block: dict) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in block["index"]) + "]"


def sharding_svg(info: dict, dims: tuple[int, int] = (0, 1)) -> str:
    """The array's blocks on a grid (two dims), each split among the processes holding it.

    Parameters
    ----------
    info : dict
        A ShardingInfo dict; merged (aggregated) layouts get text instead.
    dims : tuple of int
        The array dims drawn as rows and columns; other dims show their first blocks.

    Returns
    -------
    str
        HTML: a ``<figure>`` holding an inline SVG and a caption.
    """
    if not info:
        return "<p>empty sharding</p>"
    grid = list(info.get("grid") or info.get("tiles") or [1])
    if len(grid) < 2:
        grid = [*grid, 1] if grid else [1, 1]
        dims = (0, 1)
    r, c = dims
    rows, cols = grid[r], grid[c]
    if rows * cols > MAX_CELLS or info.get("aggregated"):
        return f"<pre>{escape(sharding_text(info))}</pre>"
    width = CELL * 1.6
    body = []
    for b in info.get("blocks", []):
        cell = list(b["cell"]) + [0, 0]
        # Blocks along the dims not drawn: only the first ones, as in the live view.
        if any(cell[d] != 0 for d in range(len(b["cell"])) if d not in (r, c)):
            continue
        x, y = cell[c] * width, cell[r] * CELL
        procs = b["addressable_by"] or [None]
        share = (width - 2) / len(procs)
        for k, p in enumerate(procs):
            fill = "#ddd" if p is None else process_colour(p)
            body.append(
                f'<rect x="{x + 1 + k * share:.1f}" y="{y + 1:.0f}" width="{share:.1f}" '
                f'height="{CELL - 2:.0f}" fill="{fill}"/>'
            )
        devices = format_ids(sorted({h[0] for h in b["holders"]}), "d")
        body.append(
            f'<rect x="{x + 1:.0f}" y="{y + 1:.0f}" width="{width - 2:.0f}" '
            f'height="{CELL - 2:.0f}" fill="none" stroke="#333"/>'
            f'<text x="{x + width / 2:.0f}" y="{y + CELL / 2 - 2:.0f}" text-anchor="middle">'
            f"{escape(devices)}</text>"
            f'<text x="{x + width / 2:.0f}" y="{y + CELL / 2 + 10:.0f}" text-anchor="middle">'
            f"{escape(format_ids(b['addressable_by']))}"
            + (f" x{b['replicas']}" if b["replicas"] > 1 else "")
            + "</text>"
        )
    svg = _svg(cols * width, rows * CELL, body, sharding_text(info).splitlines()[0])
    caption = (
        f"{info.get('spec_repr') or ''} shape {tuple(info['shape'])}: dims {r} (rows) and "
        f"{c} (columns); colours are processes"
    )
    return _figure(svg, caption)


# -- tables -------------------------------------------------------------------------------


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _text_table(header: list[str], rows: list[list]) -> str:
    cells = [header, *[[str(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


CACHE_COLUMNS = ["process", "requests", "hits", "misses", "hit rate", "saved s", "compile s"]


def _cache_rows(stats: list[dict]) -> list[list]:
    rows = []
    for s in stats:
        requests, hits = s.get("requests", 0), s.get("hits", 0)
        misses = s.get("misses", requests - hits)
        rate = s.get("hit_rate", hits / requests if requests else 0.0)
        rows.append(
            [
                f"p{s['rank']}",
                requests,
                hits,
                misses,
                f"{rate:.0%}",
                f"{s.get('time_saved', 0.0):.2f}",
                f"{s.get('compile_time', 0.0):.2f}",
            ]
        )
    return rows


def cache_html(stats: list[dict]) -> str:
    """The cache statistics as an HTML table, one row per process."""
    return _table(CACHE_COLUMNS, _cache_rows(stats)) if stats else "<p>no cache statistics</p>"


def cache_text(stats: list[dict]) -> str:
    """The cache statistics as an aligned text table."""
    return _text_table(CACHE_COLUMNS, _cache_rows(stats)) if stats else "<no cache statistics>"


LIVE_COLUMNS = ["process", "state", "heartbeat age s", "busy", "devices", "incarnation"]
# Shown once any process's transfer guard has logged a transfer.
TRANSFER_COLUMN = "transfers logged"


def _live_table(liveness: list[dict]) -> tuple[list[str], list[list]]:
    with_transfers = any(p.get("transfers") for p in liveness)
    rows = []
    for p in liveness:
        row = [
            f"p{p['rank']}",
            p.get("state", "unknown"),
            "-" if p.get("heartbeat_age") is None else f"{p['heartbeat_age']:.1f}",
            "yes" if p.get("busy") else "no",
            ",".join(map(str, p.get("devices", []))) or "-",
            p.get("incarnation", 0),
        ]
        if with_transfers:
            row.append(transfer_counts_text(p["transfers"]) if p.get("transfers") else "-")
        rows.append(row)
    return LIVE_COLUMNS + [TRANSFER_COLUMN] * with_transfers, rows


def live_html(liveness: list[dict], log: list[str]) -> str:
    """The liveness table and the newest log lines, as HTML."""
    table = _table(*_live_table(liveness)) if liveness else "<p>no processes</p>"
    tail = "".join(f"{escape(line)}\n" for line in log[-10:])
    return table + (f"<pre>{tail}</pre>" if tail else "")


def live_text(liveness: list[dict], log: list[str]) -> str:
    """The liveness table and the newest log lines, as text."""
    table = _text_table(*_live_table(liveness)) if liveness else "<no processes>"
    return "\n".join([table, *log[-10:]])
