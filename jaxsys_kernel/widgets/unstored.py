"""Views whose state a headless run does not store, so exporters show their pictures.

nbclient (and so ``jupyter nbconvert --execute``, ``jupyter execute`` and papermill) stores
the state of every widget whose comm was opened by a cell's request in the notebook's
metadata. An exporter then writes each view as a script that loads its renderer from a CDN
(an empty box offline) and drops the PNG and text beside it. Every jaxsys view carries its
own static picture, and its state is rebuilt from the kernel whenever one runs, so there is
nothing to store: a view opens its comm outside any request, which nbclient leaves out,
while a live front end's widget manager takes it as usual. JupyterLab saves no widget state
by default either; where a user turns that on, Lab still saves these views.
"""

from __future__ import annotations

from typing import Any

from .. import _compat


class Unstored:
    """Mixin for an ipywidgets widget: its comm opens outside the current request."""

    def open(self) -> None:
        """Open the comm as ipywidgets does, with no parent request."""
        kernel = _kernel()
        if kernel is None:
            super().open()  # type: ignore[misc]
            return
        with _compat.outside_any_request(kernel):
            super().open()  # type: ignore[misc]


def _kernel() -> Any:
    # Deferred: a widget built outside a kernel (a script, a test) needs no kernel package.
    from ipykernel.kernelbase import Kernel

    return Kernel.instance() if Kernel.initialized() else None
