"""Executed notebooks saved the way JupyterLab saves them, so every reader shows their pictures.

``jaxsys run --output`` executes a notebook with nbclient, which by default stores the state of
every widget the kernel made in ``metadata.widgets``. A reader then treats each view as a live
widget: ``jupyter nbconvert --to html`` writes a placeholder that loads the widget's JavaScript
from a CDN (blank offline) instead of the view's static picture, and GitHub refuses notebooks
whose widget metadata is not in the form it expects. JupyterLab, by default, saves no widget
state at all. :func:`for_readers` makes an executed notebook like that: no widget state (each
output still carries its widget view, for a live kernel, beside the static PNG and text that
the readers show), cell ids, and the kernel named in ``metadata.kernelspec``.

This module never imports JAX.
"""

from __future__ import annotations

import uuid
from typing import Any

import nbformat
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

#: Where widget state lives in a notebook's metadata (nbclient, ipywidgets and Lab agree).
WIDGETS_KEY = "widgets"
WIDGET_STATE_MIME = "application/vnd.jupyter.widget-state+json"


def for_readers(nb: Any, kernelspec: dict | None = None) -> Any:
    """Make an executed notebook read like one saved from JupyterLab (changed in place).

    Parameters
    ----------
    nb : nbformat.NotebookNode
        An executed notebook (nbformat 4).
    kernelspec : dict, optional
        ``name``, ``display_name`` and ``language`` of the kernel that ran it; recorded in
        ``metadata.kernelspec`` when the notebook names none.

    Returns
    -------
    nbformat.NotebookNode
        ``nb`` itself, valid against the nbformat schema.

    Raises
    ------
    ValueError
        If ``nb`` is not an nbformat 4 notebook.
    """
    if getattr(nb, "nbformat", None) != 4:
        raise ValueError(
            f"expected an nbformat 4 notebook, got nbformat {getattr(nb, 'nbformat', None)!r}; "
            "read it with nbformat.read(path, as_version=4)"
        )
    # Lab saves no widget state by default; a reader then shows each output's static forms.
    nb.metadata.pop(WIDGETS_KEY, None)
    if kernelspec and not nb.metadata.get("kernelspec"):
        nb.metadata["kernelspec"] = nbformat.from_dict(dict(kernelspec))
    _with_cell_ids(nb)
    nbformat.validate(nb)
    return nb


def kernelspec_of(name: str) -> dict:
    """``name``, ``display_name`` and ``language`` of an installed kernel, as Lab records them.

    Parameters
    ----------
    name : str
        The kernelspec's name, e.g. ``"jaxsys"``.

    Returns
    -------
    dict
        With ``name`` as its display name too when no such kernel is installed (the
        notebook format requires both).
    """
    try:
        spec = KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        return {"display_name": name, "name": name}
    return {"display_name": spec.display_name, "language": spec.language, "name": name}


def _with_cell_ids(nb: Any) -> None:
    """Give every cell an id, as Lab does when it saves an older notebook (nbformat 4.5)."""
    if nb.nbformat_minor < 5:
        nb.nbformat_minor = 5
    seen: set[str] = set()
    for cell in nb.cells:
        cid = cell.get("id")
        while not cid or cid in seen:
            cid = uuid.uuid4().hex[:8]
        cell["id"] = cid
        seen.add(cid)


def widget_state_problems(nb: Any) -> list[str]:
    """Why GitHub or nbconvert would trip over ``nb``'s widget metadata (empty if fine).

    A notebook may carry no widget metadata, or widget metadata whose state object has a
    ``state`` key; anything else makes GitHub refuse to render the notebook.

    Parameters
    ----------
    nb : nbformat.NotebookNode

    Returns
    -------
    list of str
    """
    widgets = nb.metadata.get(WIDGETS_KEY)
    if widgets is None:
        return []
    state = widgets.get(WIDGET_STATE_MIME) if isinstance(widgets, dict) else None
    if not isinstance(state, dict) or "state" not in state:
        return [f"metadata.{WIDGETS_KEY} has no {WIDGET_STATE_MIME}.state"]
    return []
