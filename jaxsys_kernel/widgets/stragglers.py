"""The straggler view: per step, whose arrival the others waited for, and where each
process's time went; and the dashboard that shows it below the other four views.

It draws a ``kind == "stragglers"`` summary (:func:`jaxsys_kernel.cells.stragglers_summary.
summarize`, from what ``%jaxsys where`` computes): the verdict, the latest steps and one
stacked bar per listed process (input, host, compile, compute, waiting for the others); at
many processes the ten that waited least and a histogram of the rest. Its front end is
``static/stragglers.js``; saved notebooks keep a PNG picture and a text form.

This module never imports JAX.
"""

from __future__ import annotations

from typing import Any

import traitlets

from . import fallback, pictures
from .esm import view_module
from .kinds import check_kind
from .raster import CHAR_H, LINE_H, Canvas, text_width
from .views import Dashboard, _View, _with_static

# Colours of the parts of a bar: the same as static/stragglers.js and %jaxsys where's SVG.
COLOURS = {
    "input": "#9467bd",
    "host": "#ff7f0e",
    "compile": "#d62728",
    "compute": "#1f77b4",
    "wait": "#c7c7c7",
}
BAR_W = 420
MARGIN = 6
LABEL_W = 70


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def verdict(info: dict) -> str:
    """One line: who held the others up, in what, over how many steps."""
    if not info.get("steps_total"):
        return "no step spanning processes recorded yet"
    named = info.get("named")
    head = (
        f"p{named['rank']} held the others up, in {named['category']}"
        if named
        else "no process held the others up beyond the noise"
    )
    return f"{head} ({info['steps_total']} steps, {info.get('processes', 0)} processes)"


def step_line(s: dict) -> str:
    """A step's line: who arrived last, how late, in what."""
    how = f"late by {_ms(s['late'])} in {s['category']}" if s["named"] else "within the noise"
    return f"step {s['step']}: p{s['last']} arrived last, {how}"


def stragglers_text(info: dict, recording: bool = True, note: str = "") -> str:
    """The view as text: the verdict, the steps, the mean breakdown per listed process."""
    lines = [f"Stragglers: {verdict(info)}"]
    if not recording and not info.get("steps_total"):
        lines.append("step arrivals are not recorded: %jaxsys where on")
    lines += [step_line(s) for s in info.get("steps", [])]
    parts = info.get("parts", [])
    for row in info.get("rows", []):
        lines.append(f"p{row['rank']}: " + ", ".join(f"{p} {_ms(row[p])}" for p in parts))
    hist = info.get("histogram")
    if hist:
        lines.append("mean wait inside collectives, processes per bin:")
        for i, c in enumerate(hist["counts"]):
            lo = hist["lo"] + i * hist["width"]
            lines.append(f"  {_ms(lo)} .. {_ms(lo + hist['width'])}: {c}")
    lines += [f"p{r}'s records were refused: {why}" for r, why in info.get("refused", {}).items()]
    if info.get("more_refused"):
        lines.append(f"{info['more_refused']} more processes' records were refused")
    return "\n".join(lines + ([note] if note else []))


def stragglers_picture(info: dict, recording: bool = True, note: str = "") -> Canvas:
    """The verdict and steps as text, then one stacked bar per listed process."""
    rows = info.get("rows", [])
    parts = info.get("parts", [])
    head = pictures.text_picture(
        "\n".join([f"Stragglers: {verdict(info)}"] + [step_line(s) for s in info.get("steps", [])])
    )
    if not rows:
        return pictures.stack([[head], [pictures.text_picture(note)]]) if note else head
    total = max(sum(r[p] for p in parts) for r in rows) or 1.0
    legend_w = sum(CHAR_H + 4 + text_width(p) + 12 for p in parts)
    width = max(LABEL_W + BAR_W, legend_w) + 2 * MARGIN
    bars = Canvas(width, LINE_H * (len(rows) + 1) + MARGIN)
    x = MARGIN
    for p in parts:
        bars.box(x, MARGIN, CHAR_H, CHAR_H, fill=COLOURS.get(p, "#888888"), edge="#333333")
        bars.text(x + CHAR_H + 4, MARGIN, p)
        x += CHAR_H + 4 + text_width(p) + 12
    for i, row in enumerate(rows):
        y = MARGIN + LINE_H * (i + 1)
        bars.text(MARGIN, y, f"p{row['rank']}")
        x = MARGIN + LABEL_W
        for p in parts:
            w = BAR_W * row[p] / total
            bars.box(x, y, w, CHAR_H, fill=COLOURS.get(p, "#888888"))
            x += w
    tail = stragglers_text({**info, "steps": [], "rows": []}, recording, note).splitlines()[1:]
    picture = [[head], [bars]] + ([[pictures.text_picture("\n".join(tail))]] if tail else [])
    return pictures.stack(picture, gap=0)


class StragglersView(_View):
    """Per step, whose arrival the others waited for, and each process's breakdown bar.

    Parameters
    ----------
    info : dict, optional
        A ``kind == "stragglers"`` summary
        (:func:`jaxsys_kernel.cells.stragglers_summary.summarize`).
    **kwargs
        Passed to ``anywidget.AnyWidget``.

    Examples
    --------
    >>> view = StragglersView()
    >>> view.static()["text/plain"].splitlines()[0]
    'Stragglers: no step spanning processes recorded yet'
    """

    _esm = view_module("stragglers")
    _view_kind = traitlets.Unicode("stragglers").tag(sync=True)
    info = traitlets.Dict().tag(sync=True)
    # Whether the processes record their steps (%jaxsys where on); the view says how to.
    recording = traitlets.Bool(False).tag(sync=True)
    # When the summary was taken, or why the last update failed.
    note = traitlets.Unicode("").tag(sync=True)

    def __init__(self, info: dict | None = None, **kwargs: Any) -> None:
        super().__init__(info=info or {}, **kwargs)

    @traitlets.validate("info")
    def _valid_info(self, proposal: Any) -> dict:
        return check_kind(proposal["value"], "stragglers", "StragglersView")

    def static(self) -> dict[str, str]:
        """The view as a PNG picture and as text."""
        picture = stragglers_picture(self.info, self.recording, self.note)
        return fallback.png_bundle(picture, stragglers_text(self.info, self.recording, self.note))

    def update(
        self, info: dict | None = None, *, recording: bool | None = None, note: str | None = None
    ) -> None:
        """Change what is shown (one comm message).

        Parameters
        ----------
        info : dict, optional
            A new summary.
        recording : bool, optional
            Whether the processes record their steps.
        note : str, optional
            When the summary was taken, or why an update failed.
        """
        with self.hold_sync():
            if info is not None:
                self.info = info
            if recording is not None:
                self.recording = recording
            if note is not None:
                self.note = note


class StragglersDashboard(Dashboard):
    """The :class:`~.views.Dashboard` with the straggler view as a fifth part, below the others.

    Parameters
    ----------
    stragglers : dict or StragglersView, optional
        A stragglers summary, or an existing view.
    **kwargs
        Passed to :class:`~.views.Dashboard`.

    Attributes
    ----------
    stragglers : StragglersView
        The straggler view.
    """

    def __init__(self, stragglers: dict | StragglersView | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        view = stragglers if isinstance(stragglers, StragglersView) else None
        self.stragglers = view or StragglersView(stragglers)
        self.stragglers.layout.grid_area = "stragglers"
        self.layout.grid_template_areas += ' "stragglers stragglers"'
        self.children = (*self.children, self.stragglers)

    def _repr_mimebundle_(self, **kwargs: Any):
        # The four views' picture with the straggler view's below it, in one PNG.
        view = self.stragglers
        picture = stragglers_picture(view.info, view.recording, view.note)
        static = fallback.dashboard_bundle(
            self.mesh.info,
            self.sharding.info,
            tuple(self.sharding.dims),
            self.cache.records,
            self.live.records,
            self.live.event_log,
            more=[(picture, stragglers_text(view.info, view.recording, view.note))],
        )
        return _with_static(super(Dashboard, self)._repr_mimebundle_(**kwargs), static)
