"""The one liveness probe: a process's line in /proc, read whatever its command name holds."""

from __future__ import annotations

import ctypes
import os
import sys

import pytest

from jaxsys_kernel.cluster.pids import pid_alive, process_start

from .free_pid import free_pid

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)"),
]

PR_SET_NAME, PR_GET_NAME = 15, 16


def _name(value: bytes | None = None) -> bytes:
    """This thread's command name, after setting it to ``value`` when given."""
    libc = ctypes.CDLL(None)
    if value is not None:
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(value))
    buf = ctypes.create_string_buffer(16)
    libc.prctl(PR_GET_NAME, buf)
    return buf.value


def test_a_name_with_parentheses_spaces_and_other_bytes_does_not_confuse_the_probe():
    # The main thread's name is the process's, the command name /proc/PID/stat shows.
    before, started = _name(), process_start(os.getpid())
    assert started is not None
    try:
        assert _name(b"a) R (b \xff)") == b"a) R (b \xff)"
        with open(f"/proc/{os.getpid()}/stat", "rb") as f:
            if b"(a) R (b \xff))" not in f.read():
                pytest.skip("the test does not run on the process's main thread")
        assert pid_alive(os.getpid())
        assert process_start(os.getpid()) == started
    finally:
        _name(before)


def test_a_pid_no_process_holds_is_neither_alive_nor_started():
    pid = free_pid()
    assert not pid_alive(pid)
    assert process_start(pid) is None
