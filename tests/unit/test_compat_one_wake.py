"""A cell's requests reach the ipyparallel client's IO thread as one callback, in order."""

from __future__ import annotations

import threading

import pytest

from jaxsys_kernel import _compat

pytestmark = pytest.mark.unit


class FakeLoop:
    def __init__(self):
        self.callbacks = []

    def add_callback(self, callback, *args, **kwargs):
        self.callbacks.append(lambda: callback(*args, **kwargs))

    def run_all(self):
        while self.callbacks:
            self.callbacks.pop(0)()


class FakeClient:
    """Makes each request as ipyparallel's client does: a future, then a callback to send."""

    def __init__(self, fail_at=None):
        self._io_loop = FakeLoop()
        self.sent = []
        self.fail_at = fail_at

    def _build_targets(self, ids):
        return [f"engine-{i}".encode() for i in ids], ids

    def send_execute_request(self, socket, code, silent, ident, message_future_hook):
        message_future_hook(f"future-{ident.decode()}")

        def really_send():
            if ident == self.fail_at:
                raise OSError("socket closed")
            self.sent.append((ident.decode(), code))

        self._io_loop.add_callback(really_send)


class FakeView:
    _socket = "mux"


def test_a_cells_requests_wake_the_io_thread_once_and_leave_in_order():
    client, hooked = FakeClient(), []
    _compat.send_execute(client, FakeView(), [3, 1, 2], "x = 1", lambda i, f: hooked.append((i, f)))
    assert hooked == [(0, "future-engine-3"), (1, "future-engine-1"), (2, "future-engine-2")]
    assert len(client._io_loop.callbacks) == 1 and client.sent == []
    assert isinstance(client._io_loop, FakeLoop)  # the loop is the client's own again
    client._io_loop.run_all()
    assert client.sent == [("engine-3", "x = 1"), ("engine-1", "x = 1"), ("engine-2", "x = 1")]


def test_one_failed_send_leaves_the_others_to_go():
    client = FakeClient(fail_at=b"engine-1")
    _compat.send_execute(client, FakeView(), [0, 1, 2], "x = 1", lambda i, f: None)
    client._io_loop.run_all()
    assert [e for e, _ in client.sent] == ["engine-0", "engine-2"]


def test_a_callback_given_to_the_stand_in_after_it_closed_goes_straight_to_the_loop():
    loop = FakeLoop()
    wake = _compat._OneWake(loop)
    ran = []
    wake.add_callback(ran.append, "kept")
    wake.close()
    assert len(loop.callbacks) == 1  # the kept ones, together
    # Another thread that took the stand-in while it was in place hands over a callback.
    t = threading.Thread(target=wake.add_callback, args=(ran.append, "late"))
    t.start()
    t.join(10)
    assert len(loop.callbacks) == 2
    loop.run_all()
    assert ran == ["kept", "late"]
