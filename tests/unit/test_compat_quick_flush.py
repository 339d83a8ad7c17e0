"""An engine's output streams skip the round trip to their IO thread when there is nothing
to send, and still send everything written before a flush returns."""

from __future__ import annotations

import threading

import pytest
import zmq
from ipykernel.iostream import IOPubThread, OutStream
from jupyter_client.session import Session

from jaxsys_kernel import _compat


@pytest.fixture
def stream():
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    thread = IOPubThread(pub)
    thread.start()
    session = Session(key=b"")
    out = OutStream(session, thread, "stdout", watchfd=False)
    # A PUB socket drops what it sends before the subscription arrives: wait for it.
    for _ in range(200):
        session.send(thread, "status", {"execution_state": "busy"})
        if sub.poll(50):
            break
    while sub.poll(100):
        sub.recv_multipart()
    out.sub, out.session_ = sub, session
    try:
        yield out
    finally:
        out.close()
        thread.stop()
        thread.close()
        sub.close(linger=0)
        ctx.term()


def _scheduled(out) -> list:
    calls = []
    schedule = out.pub_thread.schedule

    def counted(f):
        calls.append(f)
        schedule(f)

    out.pub_thread.schedule = counted
    return calls


def _texts(out, within_ms: int = 2000) -> list[str]:
    texts = []
    while out.sub.poll(within_ms if not texts else 100):
        _, msg = out.session_.feed_identities(out.sub.recv_multipart())
        msg = out.session_.deserialize(msg)
        if msg["header"]["msg_type"] == "stream":
            texts.append(msg["content"]["text"])
    return texts


def test_a_flush_with_nothing_written_stays_on_its_thread(stream):
    assert _compat.quick_empty_flush(stream)
    calls = _scheduled(stream)
    for _ in range(10):
        stream.flush()
    assert calls == []


def test_what_was_written_has_left_when_flush_returns(stream):
    assert _compat.quick_empty_flush(stream)
    calls = _scheduled(stream)
    stream.write("hello\n")
    stream.flush()
    assert calls, "a flush after a write must go through the IO thread"
    # Sent before flush returned: the subscriber can read it now.
    assert _texts(stream) == ["hello\n"]
    calls.clear()
    stream.flush()
    assert calls == []


def test_a_send_under_way_is_waited_for(stream):
    assert _compat.quick_empty_flush(stream)
    # The IO thread's send holds here, after it took the text from the buffer.
    entered, release = threading.Event(), threading.Event()
    send = stream.session.send

    def slow_send(*args, **kwargs):
        entered.set()
        release.wait(10)
        return send(*args, **kwargs)

    stream.session.send = slow_send
    stream.write("late\n")
    stream.pub_thread.schedule(stream._flush)
    assert entered.wait(10)
    done = threading.Event()
    flusher = threading.Thread(target=lambda: (stream.flush(), done.set()))
    flusher.start()
    # Buffer empty, nothing pending, but a send is under way: flush must wait for it.
    assert not done.wait(0.3)
    release.set()
    assert done.wait(10)
    flusher.join(10)
    assert _texts(stream) == ["late\n"]


def test_installing_twice_wraps_once_and_other_streams_are_left_alone(stream):
    assert _compat.quick_empty_flush(stream)
    first = stream.flush
    assert _compat.quick_empty_flush(stream)
    assert stream.flush is first
    assert not _compat.quick_empty_flush(object())
