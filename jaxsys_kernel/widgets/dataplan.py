"""The view of a data-loading plan: which process reads which block of a global batch.

It draws a ``dataplan`` summary (:meth:`jaxsys_kernel.data.planner.DataPlan.summary`, built on
an engine): the batch split into its devices' blocks, each coloured by the processes that
read it, in the colours the sharding view gives processes; then, per process, the slices it
reads and a bar of its bytes. Clicking a process highlights what it reads. The mime bundle
also carries the plan as a PNG picture (``image/png``, see :mod:`.fallback` for why) and as a
table (``text/plain``), so a saved notebook shows it where widgets do not render.

This module never imports JAX.
"""

from __future__ import annotations

import pathlib
from typing import Any

import anywidget
import traitlets

from ..data.draw import plan_text
from .fallback import png_bundle
from .kinds import check_kind
from .pictures import dataplan_picture
from .unstored import Unstored

_STATIC = pathlib.Path(__file__).parent / "static"


class DataPlanView(Unstored, anywidget.AnyWidget):
    """A data-loading plan drawn as blocks of the global batch and bytes per process.

    Parameters
    ----------
    info : dict, optional
        A ``dataplan`` summary dict.
    selected_process : int, optional
        The process whose reads are highlighted.
    **kwargs
        Passed to ``anywidget.AnyWidget``.

    Examples
    --------
    >>> from jaxsys_kernel.data.planner import plan
    >>> from jaxsys_kernel.engine.simulate import FakeNamedSharding, fake_devices, fake_mesh
    >>> mesh = fake_mesh(fake_devices(8, 2), (8,), ("batch",))
    >>> view = DataPlanView(plan((64, 16), FakeNamedSharding(mesh, ("batch",))).summary())
    >>> [p["nbytes"] for p in view.info["processes"]]
    [1024, 1024, 1024, 1024]
    """

    _esm = _STATIC / "dataplan.js"
    # The sharding view's stylesheet: the same blocks, chips and captions.
    _css = _STATIC / "views.css"
    _view_kind = traitlets.Unicode("dataplan").tag(sync=True)
    info = traitlets.Dict().tag(sync=True)
    selected_process = traitlets.Int(None, allow_none=True).tag(sync=True)

    def __init__(
        self, info: dict | None = None, selected_process: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(info=info or {}, selected_process=selected_process, **kwargs)

    @traitlets.validate("info")
    def _valid_info(self, proposal: Any) -> dict:
        return check_kind(proposal["value"], "dataplan", "DataPlanView", missing_ok=False)

    def text(self) -> str:
        """The plan as a table."""
        return plan_text(self.info) if self.info else "<empty data plan>"

    def _repr_mimebundle_(self, **kwargs: Any):
        bundle = super()._repr_mimebundle_(**kwargs)
        data, metadata = bundle if isinstance(bundle, tuple) else (bundle or {}, {})
        data = {k: v for k, v in data.items() if not k.startswith("text/")}
        if self.info:
            return {**data, **png_bundle(dataplan_picture(self.info), self.text())}, metadata
        return {**data, "text/plain": self.text()}, metadata
