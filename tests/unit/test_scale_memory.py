"""%jaxsys status reports each local process's resident memory."""

import os
import socket

from jaxsys_kernel.magics.actions import format_status
from jaxsys_kernel.telemetry.memory import local_rss


def test_local_rss_measures_this_machine_only():
    assert local_rss(socket.gethostname(), os.getpid()) > 10**6
    assert local_rss("another-host", os.getpid()) is None
    assert local_rss(socket.gethostname(), None) is None


def _row(rank, rss):
    return {"rank": rank, "engine_id": rank, "pid": 100 + rank, "host": "h",
            "devices": [rank], "state": "ready", "rss": rss}


def test_status_table_shows_memory_and_its_average():
    text = format_status([_row(0, 250_000_000), _row(1, 270_000_000), _row(2, None)])
    lines = text.splitlines()
    assert lines[0].split()[-1] == "memory"
    assert lines[1].endswith("250 MB") and lines[3].endswith("-")
    assert lines[-1] == (
        "memory: 260 MB per process on average, 520 MB for the 2 processes on this machine"
    )


def test_rows_without_memory_still_render():
    row = _row(0, None)
    del row["rss"]
    assert "memory:" not in format_status([row])
