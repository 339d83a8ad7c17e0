"""The bound on engine replies (cluster/reply_limit.py): its setting, its words, and the
sockets it applies to."""

from __future__ import annotations

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


def test_only_the_reply_sockets_are_bounded():
    ctx = reply_limit.bounded_context(5000)
    dealer, sub = ctx.socket(zmq.DEALER), ctx.socket(zmq.SUB)
    try:
        assert dealer.getsockopt(zmq.MAXMSGSIZE) == 5000
        assert sub.getsockopt(zmq.MAXMSGSIZE) == -1
        # One context for the process; a later cluster's bound applies to its new sockets.
        assert reply_limit.bounded_context(7000) is ctx
        later = ctx.socket(zmq.DEALER)
        assert later.getsockopt(zmq.MAXMSGSIZE) == 7000
        later.close(linger=0)
    finally:
        dealer.close(linger=0)
        sub.close(linger=0)


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
