"""The bound on engine replies (cluster/reply_limit.py): its setting, its words, and the
sockets it applies to."""

from __future__ import annotations

import gc
import struct
import threading
import time

import pytest
import zmq

from jaxsys_kernel.cluster import reply_limit
from jaxsys_kernel.errors import ConfigError


def test_the_default_is_one_gib(monkeypatch):
    monkeypatch.delenv(reply_limit.ENV, raising=False)
    assert reply_limit.limit() == reply_limit.MAX_REPLY_BYTES == 2**30


def test_the_environment_sets_another_bound(monkeypatch):
    monkeypatch.setenv(reply_limit.ENV, str(3 * 2**30))
    assert reply_limit.limit() == 3 * 2**30


@pytest.mark.parametrize("raw", ["lots", "-5", "0", "1023", "1.5e9"])
def test_a_bad_bound_is_named_with_what_to_set(monkeypatch, raw):
    monkeypatch.setenv(reply_limit.ENV, raw)
    with pytest.raises(ConfigError) as info:
        reply_limit.limit()
    said = str(info.value)
    assert f"${reply_limit.ENV}={raw!r}" in said and "unset it" in said


def test_the_error_names_the_limit_and_how_to_raise_it():
    said = reply_limit.explain(2**20)
    assert "1 MiB (1048576 bytes" in said
    assert reply_limit.ENV in said and "%jaxsys start" in said


def test_the_reply_and_output_sockets_are_bounded():
    ctx = reply_limit.bounded_context(5000)
    dealer, sub, pub = ctx.socket(zmq.DEALER), ctx.socket(zmq.SUB), ctx.socket(zmq.PUB)
    try:
        assert dealer.getsockopt(zmq.MAXMSGSIZE) == 5000
        assert sub.getsockopt(zmq.MAXMSGSIZE) == 5000
        # What the kernel sends is not ours to bound.
        assert pub.getsockopt(zmq.MAXMSGSIZE) == -1
        # A context for each client: a later cluster's bound applies to its own.
        other = reply_limit.bounded_context(7000)
        assert other is not ctx
        later = other.socket(zmq.DEALER)
        assert later.getsockopt(zmq.MAXMSGSIZE) == 7000
        other.destroy(linger=0)
    finally:
        ctx.destroy(linger=0)


class _Futures:
    """The books fail_awaited and fail_outputs read: a client with one reply and one output
    awaited."""

    def __init__(self):
        from concurrent.futures import Future

        self.results = {}
        self._outstanding_dict = {"engine-uuid": {"m1"}}
        self.output = Future()
        self._output_futures = {"m1": self.output}
        self.handled = []

    def _handle_apply_reply(self, msg):
        self.handled.append(msg)


def test_lost_output_ends_only_the_outputs_awaited():
    client = _Futures()
    error = reply_limit.OutputTooLarge(reply_limit.explain_output(2**20))
    assert reply_limit.fail_outputs(client, error) == 1
    assert client.output.exception() is error and client.handled == []
    said = str(error)
    assert "output over the kernel's limit of 1 MiB" in said and "cut short" in said
    assert reply_limit.ENV in said and "%jaxsys start" in said


def test_a_reply_over_the_bound_never_reaches_the_dealer():
    ctx = reply_limit.bounded_context(4096)
    router, dealer = zmq.Context.instance().socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.setsockopt(zmq.IDENTITY, b"client")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send(b"hello")
        assert router.poll(10_000)
        ident, _ = router.recv_multipart()
        router.send_multipart([ident, b"x" * 10_000])
        assert not dealer.poll(500)
    finally:
        dealer.close(linger=0)
        router.close(linger=0)
        ctx.destroy(linger=0)


class _Client:
    """What the watch uses of ipyparallel's client: a DEALER served by its own IO loop."""

    def __init__(self, ctx: zmq.Context, port: int):
        from tornado.ioloop import IOLoop

        self._closed = False
        self._mux_socket = ctx.socket(zmq.DEALER)
        self._mux_socket.connect(f"tcp://127.0.0.1:{port}")
        started = threading.Event()

        def run():
            self._io_loop = IOLoop()
            self._io_loop.add_callback(started.set)
            self._io_loop.start()

        self._io_thread = threading.Thread(target=run, daemon=True)
        self._io_thread.start()
        assert started.wait(10)

    def _stop_io_thread(self):
        self._io_loop.add_callback(self._io_loop.stop)
        self._io_thread.join(10)

    def close(self, linger=None):
        self._stop_io_thread()
        self._mux_socket.close(linger=linger)
        self._closed = True


def _carries_messages(ctx: zmq.Context) -> bool:
    """Whether ``ctx``'s I/O thread still moves a message from one socket to another."""
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send(b"ping")
        return bool(router.poll(5_000))
    finally:
        dealer.close(linger=0)
        router.close(linger=0)


def test_a_stopped_watch_leaves_its_context_carrying_messages():
    # A monitor sends from the context's I/O thread; were its reading end closed while it
    # still ran, the next event (here: the peer going away) would block that thread for
    # good, and every later client of the process would wait forever for its first answer.
    ctx = zmq.Context()
    peer = ctx.socket(zmq.ROUTER)
    port = peer.bind_to_random_port("tcp://127.0.0.1")
    client = _Client(ctx, port)
    try:
        watching = reply_limit.watch(client, 4096, lambda: True)
        assert watching is not None and len(watching.monitors) == 1
        watching.stop()
        assert not watching.thread.is_alive()
        peer.close(linger=0)  # a disconnect, while the watched socket still lives
        assert _carries_messages(ctx)
        # Two clients' monitors never share an address, even with the same descriptors.
        again = reply_limit.watch(client, 4096, lambda: True)
        assert again is not None and len(again.monitors) == 1
        reply_limit.close_client(client)
        assert client._closed and not again.thread.is_alive()
        assert _carries_messages(ctx)
    finally:
        if not client._closed:
            client.close(linger=0)
        ctx.destroy(linger=0)


class _SlowClient(_Client):
    """A client whose IO thread takes its time over the watched socket."""

    entered = threading.Event()

    @property
    def _mux_socket(self):
        if threading.current_thread() is getattr(self, "_io_thread", None):
            self.entered.set()
            time.sleep(0.5)
        return self._sock

    @_mux_socket.setter
    def _mux_socket(self, sock):
        self._sock = sock


class _MakingFirst:
    """An IO loop whose ``add_callback`` returns once the callback has begun, so that the
    caller's wait starts while the monitors are being made, however loaded the machine."""

    def __init__(self, loop, entered: threading.Event):
        self._loop, self._entered = loop, entered

    def add_callback(self, fn, *args):
        self._loop.add_callback(fn, *args)
        assert self._entered.wait(10)

    def __getattr__(self, name):
        return getattr(self._loop, name)


def test_a_watch_given_up_while_its_monitors_are_made_leaves_none_unread(monkeypatch):
    # The caller stops waiting while the IO thread is making the monitors. Were they made
    # and forgotten, their readers would be collected, and the next event (the peer going
    # away) would block the context's I/O thread: every later client would wait forever.
    monkeypatch.setattr(reply_limit, "_SETUP_WAIT_S", 0.1)
    ctx = zmq.Context()
    peer = ctx.socket(zmq.ROUTER)
    port = peer.bind_to_random_port("tcp://127.0.0.1")
    client = _SlowClient(ctx, port)
    client.entered = threading.Event()
    client._io_loop = _MakingFirst(client._io_loop, client.entered)
    try:
        watching = reply_limit.watch(client, 4096, lambda: True)
        # Once the monitors are being made they are kept, and read.
        assert watching is not None and len(watching.monitors) == 1
        del watching
        gc.collect()
        peer.close(linger=0)
        assert _carries_messages(ctx)
        reply_limit.close_client(client)
        assert _carries_messages(ctx)
    finally:
        if not client._closed:
            client.close(linger=0)
        ctx.destroy(linger=0)


def test_a_client_whose_context_is_blocked_takes_only_itself_down():
    # However a monitor is left without its reader, the blocked I/O thread is its own
    # client's: closing that client ends the context (which frees the thread), and the
    # next client, in a context of its own, carries messages.
    ctx = reply_limit.bounded_context(4096)
    peer = zmq.Context.instance().socket(zmq.ROUTER)
    port = peer.bind_to_random_port("tcp://127.0.0.1")
    client = _Client(ctx, port)
    client._jaxsys_context = ctx
    # Every event, so that they go on coming (the DEALER tries to connect again every
    # 0.1 s): the first sent after the closed reader's pipe is gone blocks the thread.
    reader = client._mux_socket.get_monitor_socket(zmq.EVENT_ALL)
    client._mux_socket.send(b"up")
    assert peer.poll(10_000)  # connected: closing the peer now is a disconnect
    # One pair of probe sockets, made while the context works: sockets made or closed in a
    # blocked context keep their file descriptors, so a new pair per look would pile up.
    probe_in, probe_out = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    probe_out.connect(f"tcp://127.0.0.1:{probe_in.bind_to_random_port('tcp://127.0.0.1')}")
    probe_out.send(b"ping")
    assert probe_in.poll(10_000)
    probe_in.recv_multipart()
    reader.close(linger=0)
    peer.close(linger=0)
    deadline = time.monotonic() + 20
    while True:
        probe_out.send(b"ping")
        if not probe_in.poll(500):
            break  # blocked
        probe_in.recv_multipart()
        assert time.monotonic() < deadline, "the monitor's event never blocked the context"
    started = time.monotonic()
    reply_limit.close_client(client)
    assert ctx.closed and time.monotonic() - started < reply_limit.CONTEXT_END_S
    later = reply_limit.bounded_context(4096)
    try:
        assert _carries_messages(later)
    finally:
        later.destroy(linger=0)


class _Loop:
    def __init__(self):
        self.calls = []

    def add_callback(self, fn, *args):
        self.calls.append((fn.__name__, args))


def _output_client():
    client = _Futures()
    client._io_loop, client._iopub_socket = _Loop(), object()
    return client


def _event(kind: int) -> list[bytes]:
    """A monitor's message as ZeroMQ sends it: the event and its value, then the endpoint."""
    return [struct.pack("=hi", kind, 0), b"tcp://127.0.0.1:5555"]


def test_a_context_that_does_not_end_is_waited_for_only_as_long_as_asked(caplog):
    # A socket pyzmq does not track is never closed by ending the context: the end waits.
    ctx = reply_limit.bounded_context(4096)
    stuck = zmq.Socket(ctx, zmq.DEALER)
    peer = zmq.Context.instance().socket(zmq.ROUTER)
    client = _Client(ctx, peer.bind_to_random_port("tcp://127.0.0.1"))
    client._jaxsys_context = ctx
    try:
        started = time.monotonic()
        reply_limit.close_client(client, wait=0.3)
        took = time.monotonic() - started
        assert 0.3 <= took < 2.0, took
        assert "did not end within 0.3 s" in caplog.text
    finally:
        stuck.close(linger=0)  # the context ends now, on its thread
        peer.close(linger=0)
    deadline = time.monotonic() + 10
    while not ctx.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ctx.closed


def test_a_lost_output_channel_is_remade_at_once_and_outputs_end_once_it_is_up():
    client = _output_client()
    lost = {}
    ctx = zmq.Context()
    reader, writer = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    mon, monitors = reader, {reader: client._iopub_socket}
    try:
        reader.bind("inproc://events")
        writer.connect("inproc://events")

        def feed(kind):
            writer.send_multipart(_event(kind))
            assert reader.poll(1000)
            reply_limit._take_event(reader, lost, output=True)

        feed(zmq.EVENT_DISCONNECTED)
        loss = lost[mon]
        loss.when -= reply_limit.SETTLE_S
        reply_limit._settle(client, monitors, lost, 2**20, lambda: False)
        assert [c for c, _ in client._io_loop.calls] == ["_connect_again"] and loss.remade
        # Its own connection failing before it is up changes nothing; once up, and the
        # subscription given its time, the outputs awaited end.
        feed(zmq.EVENT_DISCONNECTED)
        assert lost[mon] is loss
        feed(zmq.EVENT_CONNECTED)
        loss.connected_at -= reply_limit.SUBSCRIBED_S
        reply_limit._settle(client, monitors, lost, 2**20, lambda: False)
        assert [c for c, _ in client._io_loop.calls][-1] == "fail_outputs" and not lost
        # A connection that never comes up: the outputs end anyway, and it is tried anew.
        stuck = reply_limit._Loss(0.0, "tcp://127.0.0.1:5555", output=True, remade=True)
        lost[mon] = stuck
        reply_limit._settle(client, monitors, lost, 2**20, lambda: False)
        assert [c for c, _ in client._io_loop.calls][-1] == "fail_outputs"
        assert lost[mon] is not stuck and not lost[mon].remade
        # The controller's death is no refusal: nothing is ended or remade.
        lost[mon].when -= reply_limit.SETTLE_S
        before = len(client._io_loop.calls)
        reply_limit._settle(client, monitors, lost, 2**20, lambda: True)
        assert not lost and len(client._io_loop.calls) == before
    finally:
        reader.close(linger=0)
        writer.close(linger=0)
        ctx.term()
