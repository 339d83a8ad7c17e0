"""Notebook views of meshes, shardings, compilation caches and process liveness.

Each view is an ``anywidget.AnyWidget`` whose synced traits hold a plain summary dict (built
on the engines by :mod:`jaxsys_kernel.engine.summaries`, or by the telemetry hub from
:mod:`jaxsys_kernel.telemetry.schema` records). The traits are the whole state: a saved
notebook redraws from them with no kernel. Each view has its own ES module in ``static/``
(``mesh.js``, ``sharding.js``, ``cache.js``, ``live.js``) with the shared helpers inlined by
:func:`jaxsys_kernel.widgets.esm.view_module`, and all share ``static/views.css``.

This module never imports JAX.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable
from typing import Any

import anywidget
import ipywidgets
import traitlets

from ..telemetry import aggregate
from . import fallback
from .artifact import ArtifactView
from .dataplan import DataPlanView
from .esm import view_module
from .kinds import check_kind as _check_kind
from .rowsync import RowsMixin, cache_summary, change_log
from .unstored import Unstored

_STATIC = pathlib.Path(__file__).parent / "static"

#: Newest log lines a :class:`LiveDevicesView` keeps in its trait.
MAX_LOG = 500

_UNSET: Any = object()


def _plain(record: Any) -> dict:
    """A record as a dict: schema dataclasses go through ``to_dict`` (adds derived fields)."""
    if hasattr(record, "to_dict"):
        return record.to_dict()
    if isinstance(record, dict):
        return record
    raise TypeError(f"expected a dict or a schema record, got {type(record).__qualname__}")


class _View(Unstored, anywidget.AnyWidget):
    """Base of the jaxsys views: the shared stylesheet and the static renderings."""

    _css = _STATIC / "views.css"
    _view_kind = traitlets.Unicode("").tag(sync=True)

    def static(self) -> dict[str, str]:
        """The view's static forms as a mime bundle, for where widgets do not run.

        See :mod:`.fallback` for which forms survive where.
        """
        raise NotImplementedError

    def _repr_mimebundle_(self, **kwargs: Any):
        return _with_static(super()._repr_mimebundle_(**kwargs), self.static())


def _with_static(bundle: Any, static: dict[str, str]) -> tuple[dict, dict]:
    """A widget's mime bundle with the static forms beside the widget view (they replace
    any text anywidget put there)."""
    data, metadata = bundle if isinstance(bundle, tuple) else (bundle or {}, {})
    widget = {k: v for k, v in data.items() if not k.startswith("text/")}
    return {**widget, **static}, metadata


class MeshView(_View):
    """A device mesh drawn as a grid, each device coloured by its process.

    Two mesh axes become rows and columns; leading axes of a 3-D or 4-D mesh become small
    multiples (a 4-D mesh puts its first two axes on a grid of panels). Cells show the
    device id, process and coordinates; slices of a hybrid mesh are outlined.

    Parameters
    ----------
    info : dict, optional
        A MeshInfo dict from :func:`jaxsys_kernel.engine.summaries.mesh_info`.
    **kwargs
        Passed to ``anywidget.AnyWidget``.

    Examples
    --------
    >>> from jaxsys_kernel.engine.summaries import fake_devices, fake_mesh, mesh_info
    >>> view = MeshView(mesh_info(fake_mesh(fake_devices(8, 2), (4, 2), ("x", "y"))))
    >>> view.info["shape"]
    [4, 2]
    """

    _esm = view_module("mesh")
    _view_kind = traitlets.Unicode("mesh").tag(sync=True)
    info = traitlets.Dict().tag(sync=True)

    def __init__(self, info: dict | None = None, **kwargs: Any) -> None:
        super().__init__(info=info or {}, **kwargs)

    @traitlets.validate("info")
    def _valid_info(self, proposal: Any) -> dict:
        return _check_kind(proposal["value"], "mesh", "MeshView")

    def static(self) -> dict[str, str]:
        """The mesh as a PNG grid and a one-line summary."""
        return fallback.mesh_bundle(self.info)

    def update(self, info: dict) -> None:
        """Show another mesh (one comm message).

        Parameters
        ----------
        info : dict
            A MeshInfo dict.
        """
        with self.hold_sync():
            self.info = info


class ShardingView(_View):
    """An array's global shape split into the blocks its devices hold.

    Two dims are drawn (``dims``); the blocks shown along the other dims are the first
    ones, as the caption says. Each block names its devices and processes and carries a
    ``×n`` badge when it is replicated. Clicking a process in the legend sets
    ``selected_process`` and highlights the blocks that process can address. Large
    layouts (thousands of devices) are drawn on a canvas, merging cells that would be
    smaller than a few pixels.

    Parameters
    ----------
    info : dict, optional
        A ShardingInfo dict from :func:`jaxsys_kernel.engine.summaries.sharding_info`.
    dims : tuple of int, optional
        The array dims drawn as rows and columns.
    selected_process : int, optional
        The process whose blocks are highlighted.
    **kwargs
        Passed to ``anywidget.AnyWidget``.
    """

    _esm = view_module("sharding")
    _view_kind = traitlets.Unicode("sharding").tag(sync=True)
    info = traitlets.Dict().tag(sync=True)
    dims = traitlets.List(traitlets.Int(), default_value=[0, 1], minlen=2, maxlen=2).tag(sync=True)
    selected_process = traitlets.Int(None, allow_none=True).tag(sync=True)

    def __init__(
        self,
        info: dict | None = None,
        dims: Iterable[int] = (0, 1),
        selected_process: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            info=info or {}, dims=list(dims), selected_process=selected_process, **kwargs
        )

    @traitlets.validate("info")
    def _valid_info(self, proposal: Any) -> dict:
        return _check_kind(proposal["value"], "sharding", "ShardingView")

    def static(self) -> dict[str, str]:
        """The layout as a PNG grid of blocks and a short summary."""
        return fallback.sharding_bundle(self.info, tuple(self.dims))

    @traitlets.validate("dims")
    def _valid_dims(self, proposal: Any) -> list[int]:
        r, c = proposal["value"]
        if r == c or r < 0 or c < 0:
            raise traitlets.TraitError(f"dims must be two different dims, got {[r, c]}")
        return [r, c]

    def update(
        self,
        info: dict | None = None,
        *,
        dims: Iterable[int] | None = None,
        selected_process: int | None = _UNSET,
    ) -> None:
        """Change what is shown (one comm message).

        Parameters
        ----------
        info : dict, optional
            A new ShardingInfo dict.
        dims : tuple of int, optional
            New displayed dims.
        selected_process : int or None, optional
            New highlighted process; ``None`` clears the highlight. Left as is if omitted.
        """
        with self.hold_sync():
            if info is not None:
                self.info = info
            if dims is not None:
                self.dims = list(dims)
            if selected_process is not _UNSET:
                self.selected_process = selected_process


class CacheView(RowsMixin, _View):
    """Compilation-cache statistics, one table row per process plus a total.

    Above :data:`~jaxsys_kernel.telemetry.aggregate.ROWS_UP_TO` processes, a row per group
    of ranks (``summary``), and the rows of the group opened (``open_group``) in ``stats``.

    Parameters
    ----------
    stats : list of dict or CacheStats, optional
        Per-process records (:class:`jaxsys_kernel.telemetry.schema.CacheStats` or its
        ``to_dict()``): ``rank, requests, hits, misses, hit_rate, time_saved, compile_time,
        compiles, entries, bytes, last_functions``. ``misses`` and ``hit_rate`` are
        derived when missing.
    **kwargs
        Passed to ``anywidget.AnyWidget``.
    """

    _esm = view_module("cache")
    _view_kind = traitlets.Unicode("cache").tag(sync=True)
    stats = traitlets.List(traitlets.Dict()).tag(sync=True)

    def __init__(self, stats: Iterable[Any] | None = None, **kwargs: Any) -> None:
        super().__init__(stats=[_plain(s) for s in stats or ()], **kwargs)
        self._start_rows("stats", cache_summary, ages=False)

    @property
    def records(self) -> list[dict]:
        """Every process's statistics (``stats`` holds the rows drawn)."""
        return self._rows.records

    def static(self) -> dict[str, str]:
        """The statistics as an HTML and a text table."""
        return {
            "text/html": fallback.cache_html(self.records),
            "text/plain": fallback.cache_text(self.records),
        }

    def update(self, stats: Iterable[Any]) -> None:
        """Replace the statistics (one comm message).

        Parameters
        ----------
        stats : list of dict or CacheStats
            Per-process records.
        """
        self._rows.set([_plain(s) for s in stats])


class LiveDevicesView(RowsMixin, _View):
    """Which processes and devices are alive, with heartbeat ages and an event log.

    Rows change by deltas and the log by appended lines. Above
    :data:`~jaxsys_kernel.telemetry.aggregate.ROWS_UP_TO` processes the view shows a
    summary (counts by state, groups of ranks, shared errors) and the rows of the group
    opened (``open_group``) in ``liveness``.

    Parameters
    ----------
    liveness : list of dict or Liveness, optional
        Per-process records (:class:`jaxsys_kernel.telemetry.schema.Liveness` or its
        ``to_dict()``): ``rank, state, heartbeat_age, busy, devices, incarnation``.
    log : list of str, optional
        Event-log lines, oldest first; kept in the ``event_log`` trait (the name ``log``
        belongs to the widget's logger), trimmed to the newest :data:`MAX_LOG`.
    **kwargs
        Passed to ``anywidget.AnyWidget``.
    """

    _esm = view_module("live")
    _view_kind = traitlets.Unicode("live").tag(sync=True)
    liveness = traitlets.List(traitlets.Dict()).tag(sync=True)
    event_log = traitlets.List(traitlets.Unicode()).tag(sync=True)
    # Buttons (stop, stacks, kill, restart) appear when a handler is attached; clicks
    # arrive as custom messages ``{"action": ..., "rank": ...}``.
    controls = traitlets.Bool(False).tag(sync=True)
    control_status = traitlets.Unicode("").tag(sync=True)
    # One line on the kernel's telemetry receiver: events taken, dropped, and whether it runs.
    telemetry_health = traitlets.Unicode("").tag(sync=True)

    def on_control(self, handler) -> None:
        """Show the control buttons and call ``handler(action, rank)`` on every click.

        Parameters
        ----------
        handler : callable
            Receives the action (``stop``, ``stacks``, ``kill``, ``restart``,
            ``restart-world``) and the process (None for cluster-wide actions).
        """

        def dispatch(_widget, content, _buffers) -> None:
            if isinstance(content, dict) and "action" in content:
                handler(str(content["action"]), content.get("rank"))

        self.on_msg(dispatch)
        self.controls = True

    def __init__(
        self,
        liveness: Iterable[Any] | None = None,
        log: Iterable[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            liveness=[_plain(p) for p in liveness or ()],
            event_log=list(log or ())[-MAX_LOG:],
            **kwargs,
        )
        self._start_rows("liveness", aggregate.summarize, ages=True)

    @property
    def records(self) -> list[dict]:
        """Every process's liveness (``liveness`` holds the rows drawn)."""
        return self._rows.records

    def static(self) -> dict[str, str]:
        """The liveness table and the newest log lines, as HTML and text."""
        return {
            "text/html": fallback.live_html(self.records, self.event_log),
            "text/plain": fallback.live_text(self.records, self.event_log),
        }

    def update(
        self,
        liveness: Iterable[Any] | None = None,
        log: Iterable[str] | None = None,
        *,
        append: Iterable[str] = (),
    ) -> None:
        """Change the liveness table and/or the log (one comm message).

        Parameters
        ----------
        liveness : list of dict or Liveness, optional
            New per-process records.
        log : list of str, optional
            Replaces the whole log.
        append : list of str, optional
            Lines added after the log (after ``log`` if both are given).
        """
        told = change_log(self, log, list(append), MAX_LOG)
        if liveness is not None:
            self._rows.set([_plain(p) for p in liveness], told)
        elif told:
            self.send({"type": "log", **told["log"]})


class Dashboard(Unstored, ipywidgets.GridBox):
    """The four views side by side; each is also usable on its own.

    Parameters
    ----------
    mesh : dict or MeshView, optional
        MeshInfo dict, or an existing view to place.
    sharding : dict or ShardingView, optional
        ShardingInfo dict, or an existing view.
    cache : list or CacheView, optional
        Cache records, or an existing view.
    live : list or LiveDevicesView, optional
        Liveness records, or an existing view.
    log : list of str, optional
        Event-log lines for the liveness view.
    **kwargs
        Passed to ``ipywidgets.GridBox``.

    Attributes
    ----------
    mesh, sharding, cache, live : widgets
        The four views.
    """

    def __init__(
        self,
        mesh: dict | MeshView | None = None,
        sharding: dict | ShardingView | None = None,
        cache: Iterable[Any] | CacheView | None = None,
        live: Iterable[Any] | LiveDevicesView | None = None,
        log: Iterable[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.mesh = mesh if isinstance(mesh, MeshView) else MeshView(mesh)
        self.sharding = sharding if isinstance(sharding, ShardingView) else ShardingView(sharding)
        self.cache = cache if isinstance(cache, CacheView) else CacheView(cache)
        self.live = live if isinstance(live, LiveDevicesView) else LiveDevicesView(live, log)
        layout = kwargs.pop(
            "layout",
            ipywidgets.Layout(
                grid_template_columns="minmax(0, 1fr) minmax(0, 1fr)",
                grid_template_areas='"mesh sharding" "cache cache" "live live"',
                grid_gap="12px",
                width="100%",
            ),
        )
        # Tables read badly in half a row: mesh and sharding share the first row, the cache
        # and liveness tables get a row each.
        for view, area in (
            (self.mesh, "mesh"),
            (self.sharding, "sharding"),
            (self.cache, "cache"),
            (self.live, "live"),
        ):
            view.layout.grid_area = area
        super().__init__(
            children=[self.mesh, self.sharding, self.cache, self.live], layout=layout, **kwargs
        )

    def _repr_mimebundle_(self, **kwargs: Any):
        static = fallback.dashboard_bundle(
            self.mesh.info,
            self.sharding.info,
            tuple(self.sharding.dims),
            self.cache.records,
            self.live.records,
            self.live.event_log,
        )
        return _with_static(super()._repr_mimebundle_(**kwargs), static)

    def update(
        self,
        *,
        mesh: dict | None = None,
        sharding: dict | None = None,
        cache: Iterable[Any] | None = None,
        live: Iterable[Any] | None = None,
        log: Iterable[str] | None = None,
        append: Iterable[str] = (),
    ) -> None:
        """Update the parts that are given; each changed view sends one comm message.

        Parameters
        ----------
        mesh, sharding : dict, optional
            New MeshInfo / ShardingInfo.
        cache, live : list, optional
            New cache / liveness records.
        log, append : list of str, optional
            As in :meth:`LiveDevicesView.update`.
        """
        if mesh is not None:
            self.mesh.update(mesh)
        if sharding is not None:
            self.sharding.update(sharding)
        if cache is not None:
            self.cache.update(cache)
        append = list(append)
        if live is not None or log is not None or append:
            self.live.update(live, log, append=append)


_VIEWS = {
    "mesh": MeshView,
    "sharding": ShardingView,
    "export": ArtifactView,
    "dataplan": DataPlanView,
}


def view_for(summary: dict, **kwargs: Any) -> MeshView | ShardingView | ArtifactView:
    """The view that draws a summary, chosen by its ``kind``.

    Parameters
    ----------
    summary : dict
        A MeshInfo (``kind == "mesh"``), ShardingInfo (``kind == "sharding"``) or export
        summary (``kind == "export"``) dict.
    **kwargs
        Passed to the view (e.g. ``dims`` for a sharding).

    Returns
    -------
    MeshView, ShardingView or ArtifactView

    Raises
    ------
    ValueError
        If the summary has no known ``kind``.
    """
    kind = summary.get("kind") if isinstance(summary, dict) else None
    if kind not in _VIEWS:
        raise ValueError(
            f"no view for a summary of kind {kind!r}; expected one of {sorted(_VIEWS)} "
            "(from engine.summaries.mesh_info / sharding_info, engine.export_info.export_info)"
        )
    return _VIEWS[kind](summary, **kwargs)
