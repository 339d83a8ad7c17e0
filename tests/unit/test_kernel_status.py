"""Comm messages served beside a running cell do not announce the kernel busy or idle."""

from __future__ import annotations

import threading

from jaxsys_kernel.kernel.kernel import _beside_a_cell


def header(msg_type: str) -> dict:
    return {"header": {"msg_type": msg_type, "msg_id": "m"}}


def on_a_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(timeout=10)
    return out[0]


def test_a_comm_message_on_a_subshell_thread_is_silent():
    assert on_a_thread(lambda: _beside_a_cell(header("comm_msg")))
    assert on_a_thread(lambda: _beside_a_cell(header("comm_close")))


def test_requests_and_the_main_shell_still_announce():
    assert not on_a_thread(lambda: _beside_a_cell(header("execute_request")))
    assert not _beside_a_cell(header("comm_msg"))  # the main shell's thread
    assert not _beside_a_cell(None) and not _beside_a_cell({})
