"""The artifact card of an exported computation: a widget, static HTML and plain text.

The card draws an ``export`` summary (built on an engine by
:func:`jaxsys_kernel.engine.export_info.export_info`): the function, its input and output
shapes with their symbols, constraints, shardings and device count, platforms, the calling
convention and the window the running jaxlib accepts, the serialized size and the safety
checks that were turned off. Its mime bundle also carries the same facts as HTML (for
notebooks viewed without a kernel) and as text (for headless runs and terminals).

This module never imports JAX.
"""

from __future__ import annotations

import html
import pathlib
from typing import Any

import anywidget
import traitlets

from .kinds import check_kind
from .unstored import Unstored

_STATIC = pathlib.Path(__file__).parent / "static"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 10_000 else f"{n / 1024:,.1f} KiB"


def card_rows(info: dict) -> list[tuple[str, str]]:
    """The card's facts as (label, text) rows, in the order every form shows them."""
    lo, hi = info.get("accepted", [None, None])
    loads = (
        f"{_yes(info.get('loads_here', False))}: calling convention "
        f"{info.get('calling_convention')}, this jaxlib ({info.get('jaxlib', '?')}) accepts "
        f"{lo} to {hi}"
    )
    runs = _yes(info.get("runs_here", False))
    if info.get("why_not"):
        runs += f" ({info['why_not']})"
    devices = f"{info.get('nr_devices')}"
    if info.get("mesh"):
        devices += f" (mesh {info['mesh']})"
    devices += f"; this world has {info.get('devices_here', '?')}"
    symbols = ", ".join(info.get("symbols") or []) or "none (static shapes)"
    rows = [
        ("function", str(info.get("fun_name", "?"))),
        *(_arg_rows("inputs", info.get("inputs", []))),
        *(_arg_rows("outputs", info.get("outputs", []))),
        ("symbols", symbols),
        ("constraints", ", ".join(info.get("constraints") or []) or "none"),
        ("devices", devices),
        (
            "platforms",
            f"{', '.join(info.get('platforms', []))} (this process: "
            f"{info.get('platform_here', '?')})",
        ),
        ("loads here", loads),
        ("runs here", runs),
        ("serialized", _size(int(info.get("serialized_bytes", 0)))),
        ("checks off", ", ".join(info.get("disabled_checks") or []) or "none"),
        ("effects", ", ".join(info.get("effects") or []) or "none"),
        ("derivatives", "reverse-mode available" if info.get("has_vjp") else "none"),
    ]
    if info.get("path"):
        rows.append(("file", str(info["path"])))
    return rows


def _arg_rows(label: str, args: list[dict]) -> list[tuple[str, str]]:
    if not args:
        return [(label, "none")]
    width = max(len(a["name"]) for a in args)
    twidth = max(len(a["type"]) for a in args)
    out = []
    for i, a in enumerate(args):
        sharding = a.get("sharding") or "unspecified sharding"
        text = f"{a['name'].ljust(width)}  {a['type'].ljust(twidth)}  {sharding}"
        out.append((label if i == 0 else "", text))
    return out


def text_card(info: dict) -> str:
    """The card as plain text (same facts as the widget)."""
    rows = card_rows(info)
    width = max(len(k) for k, _ in rows)
    head = f"Exported {info.get('fun_name', '?')}"
    return "\n".join([head, *(f"  {k.ljust(width)}  {v}".rstrip() for k, v in rows)])


def html_card(info: dict) -> str:
    """The card as static HTML (no script; for notebooks shown without a kernel)."""
    body = "".join(
        f"<tr><th style='text-align:left;padding-right:1em;vertical-align:top'>"
        f"{html.escape(k)}</th><td><code>{html.escape(v)}</code></td></tr>"
        for k, v in card_rows(info)
    )
    title = html.escape(f"Exported {info.get('fun_name', '?')}")
    return f"<div class='jxs-artifact'><b>{title}</b><table>{body}</table></div>"


class ArtifactView(Unstored, anywidget.AnyWidget):
    """The card of an exported computation (``jax.export.Exported``).

    Parameters
    ----------
    info : dict, optional
        An ``export`` summary from :func:`jaxsys_kernel.engine.export_info.export_info`.
    **kwargs
        Passed to ``anywidget.AnyWidget``.

    Examples
    --------
    >>> view = ArtifactView({"kind": "export", "fun_name": "f", "inputs": [], "outputs": []})
    >>> print(view.text().splitlines()[0])
    Exported f
    """

    _esm = _STATIC / "artifact.js"
    _css = _STATIC / "artifact.css"
    info = traitlets.Dict().tag(sync=True)

    def __init__(self, info: dict | None = None, **kwargs: Any) -> None:
        super().__init__(info=info or {}, **kwargs)

    @traitlets.validate("info")
    def _valid_info(self, proposal: Any) -> dict:
        return check_kind(proposal["value"], "export", "ArtifactView")

    def text(self) -> str:
        """The card as plain text."""
        return text_card(self.info)

    def _repr_mimebundle_(self, **kwargs: Any):
        bundle = super()._repr_mimebundle_(**kwargs)
        data, metadata = bundle if isinstance(bundle, tuple) else (bundle or {}, {})
        data = {**data, "text/plain": self.text(), "text/html": html_card(self.info)}
        return data, metadata
