"""Which front end draws progress how: a terminal console gets carriage returns."""

from __future__ import annotations

import pytest

from jaxsys_kernel.cluster.front_end import (
    attached_processes,
    client_sockets,
    kernel_ports,
    parent_command,
    progress_as_stream,
)

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


def test_outside_a_kernel_no_port_is_looked_at():
    assert kernel_ports() == set() and attached_processes() == []


def test_the_connection_table_is_read_as_the_kernel_reads_it(tmp_path):
    table = tmp_path / "tcp"
    table.write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:A000 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000 0 111\n"
        "   1: 0100007F:1F90 0100007F:A000 01 00000000:00000000 00:00000000 00000000  1000 0 222\n"
        "   2: 0100007F:A001 0100007F:1F90 0A 00000000:00000000 00:00000000 00000000  1000 0 333\n"
        "   3: garbage\n"
    )
    # 0x1F90 is 8080: the client's side of the established connection only.
    assert client_sockets({8080}, tables=(str(table),)) == {"111"}
