"""Static forms of the views, for where widgets do not run.

A saved notebook is read in places that never run the views' JavaScript: JupyterLab and
Notebook 7 when the notebook is not trusted, ``jupyter nbconvert --to html``, GitHub, terminals.
Each view therefore puts in its mime bundle, beside the widget, the form of its picture that
survives there: the mesh and the sharding as ``image/png`` (the one picture format all of them
show; see :mod:`.raster`), the cache and liveness tables as plain ``text/html`` tables (which
every sanitizer keeps), and always a readable ``text/plain``. Picture views carry no
``text/html``: an untrusted notebook prefers HTML to PNG, and its sanitizer would strip an SVG
down to run-together labels. Process colours are those of the live views
(:data:`jaxsys_kernel.data.draw.PALETTE`).

This module never imports JAX.
"""

from __future__ import annotations

import base64
from html import escape

from ..data.draw import format_ids
from ..telemetry.schema import transfer_counts_text
from . import pictures
from .raster import Canvas


def png_bundle(picture: Canvas, text: str) -> dict[str, str]:
    """A picture and its text as a mime bundle: base64 ``image/png`` and ``text/plain``."""
    return {"image/png": base64.b64encode(picture.png()).decode("ascii"), "text/plain": text}


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


def mesh_bundle(info: dict) -> dict[str, str]:
    """The mesh's static forms: its picture as PNG and :func:`mesh_text`."""
    if not info:
        return {"text/plain": mesh_text(info)}
    return png_bundle(pictures.mesh_picture(info), mesh_text(info))


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


def sharding_bundle(info: dict, dims=(0, 1)) -> dict[str, str]:
    """The sharding's static forms: its picture (dims ``dims``) as PNG and :func:`sharding_text`."""
    if not info:
        return {"text/plain": sharding_text(info)}
    return png_bundle(pictures.sharding_picture(info, dims), sharding_text(info))


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
            # A process restarted alone keeps the world's incarnation: say the restarts.
            f"{p.get('incarnation', 0)}"
            + (f" · restarted {p['restarts']}×" if p.get("restarts") else ""),
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


def dashboard_bundle(
    mesh: dict, sharding: dict, dims, stats: list[dict], liveness, log, more=()
) -> dict:
    """The dashboard's static forms: one PNG of the four parts and their texts.

    The mesh and the sharding are drawn side by side, the cache and liveness tables below
    them as text; all in one picture, because a bundle shows one form where it is read.
    ``more`` holds further parts as (picture, text) pairs, drawn below the others.
    """
    top = [pictures.mesh_picture(mesh)] if mesh else []
    top += [pictures.sharding_picture(sharding, dims)] if sharding else []
    tables = [cache_text(stats), live_text(liveness, log)]
    rows = [top] if top else []
    rows += [[pictures.text_picture(t)] for t in tables] + [[c] for c, _ in more]
    text = "\n\n".join([mesh_text(mesh), sharding_text(sharding), *tables, *(t for _, t in more)])
    return png_bundle(pictures.stack(rows), text)
