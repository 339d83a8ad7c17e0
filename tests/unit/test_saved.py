"""Executed notebooks are saved as JupyterLab saves them: no widget state, ids, a kernelspec."""

from __future__ import annotations

import nbformat
import pytest

from jaxsys_kernel import saved
from jaxsys_kernel.engine.summaries import fake_devices, fake_mesh, mesh_info
from jaxsys_kernel.widgets import MeshView

SPEC = {"display_name": "jaxsys (multi-host JAX)", "language": "python", "name": "jaxsys"}


def executed(nbformat_minor: int = 5) -> nbformat.NotebookNode:
    """A notebook as nbclient leaves it: a view's output and the widgets' state."""
    data, _ = MeshView(
        mesh_info(fake_mesh(fake_devices(4, 2), (2, 2), ("x", "y")))
    )._repr_mimebundle_()
    nb = nbformat.v4.new_notebook()
    nb.nbformat_minor = nbformat_minor
    cell = nbformat.v4.new_code_cell("mesh", execution_count=1)
    cell.outputs = [nbformat.v4.new_output("display_data", data=data)]
    nb.cells = [cell, nbformat.v4.new_markdown_cell("text")]
    if nbformat_minor < 5:
        for c in nb.cells:
            c.pop("id", None)
    model = data["application/vnd.jupyter.widget-view+json"]["model_id"]
    nb.metadata["widgets"] = {
        saved.WIDGET_STATE_MIME: {"state": {model: {}}, "version_major": 2, "version_minor": 0}
    }
    return nb


def test_widget_state_goes_and_the_outputs_keep_their_picture_and_view():
    nb = saved.for_readers(executed(), SPEC)
    assert "widgets" not in nb.metadata and saved.widget_state_problems(nb) == []
    (out,) = nb.cells[0].outputs
    assert set(out.data) == {
        "application/vnd.jupyter.widget-view+json",
        "image/png",
        "text/plain",
    }
    assert nb.metadata.kernelspec == SPEC


def test_an_old_notebook_gets_cell_ids_and_stays_valid(tmp_path):
    nb = saved.for_readers(executed(nbformat_minor=4), SPEC)
    ids = [c.id for c in nb.cells]
    assert nb.nbformat_minor == 5 and len(set(ids)) == 2 and all(ids)
    nbformat.write(nb, tmp_path / "out.ipynb")
    again = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert [c.id for c in again.cells] == ids and "widgets" not in again.metadata


def test_a_kernelspec_already_named_is_kept():
    nb = executed()
    nb.metadata["kernelspec"] = {"name": "other", "display_name": "Other", "language": "python"}
    assert saved.for_readers(nb, SPEC).metadata.kernelspec.name == "other"


def test_widget_metadata_without_state_is_a_problem():
    nb = executed()
    assert saved.widget_state_problems(nb) == []
    nb.metadata["widgets"] = {saved.WIDGET_STATE_MIME: {"version_major": 2}}
    assert saved.widget_state_problems(nb) == [
        f"metadata.widgets has no {saved.WIDGET_STATE_MIME}.state"
    ]


def test_not_a_notebook_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match=r"nbformat.read\(path, as_version=4\)"):
        saved.for_readers(nbformat.from_dict({"nbformat": 3, "metadata": {}}))


def test_kernelspec_of_an_unknown_kernel_is_its_name_and_still_valid():
    spec = saved.kernelspec_of("no-such-kernel-here")
    assert spec == {"display_name": "no-such-kernel-here", "name": "no-such-kernel-here"}
    saved.for_readers(executed(), spec)
