"""Which front end draws progress how: a terminal console gets carriage returns."""

from __future__ import annotations

import pytest

from jaxsys_kernel.cluster.front_end import parent_command, progress_as_stream

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "environ,parent,stream",
    [
        ({}, "/venv/bin/python /venv/bin/jupyter-console --kernel jaxsys", True),
        ({}, "/venv/bin/python -m jupyter_console --kernel jaxsys", True),
        ({}, "/venv/bin/python /venv/bin/jupyter-lab", False),
        ({}, "", False),
        ({"JAXSYS_PROGRESS": "display"}, "/venv/bin/jupyter-console", False),
        ({"JAXSYS_PROGRESS": "Stream"}, "/venv/bin/jupyter-lab", True),
        ({"JAXSYS_PROGRESS": "nonsense"}, "/venv/bin/jupyter-lab", False),
    ],
)
def test_progress_is_a_stream_under_a_console_only(environ, parent, stream):
    assert progress_as_stream(environ, parent) is stream


def test_a_value_that_means_nothing_is_named_once(capsys):
    for _ in range(3):
        assert progress_as_stream({"JAXSYS_PROGRESS": "bars"}, "") is False
    said = capsys.readouterr().err
    assert said.count("JAXSYS_PROGRESS='bars' is neither 'stream' nor 'display'") == 1, said


def test_the_parent_command_is_read():
    # pytest's own parent: a shell or a runner; it is read, whatever it is.
    assert isinstance(parent_command(), str)
