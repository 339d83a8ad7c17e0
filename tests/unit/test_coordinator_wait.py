"""Joining JAX only once process 0's coordination service listens, and not asking JAX to
detect on a pod what every engine is already told."""

from __future__ import annotations

import socket
import threading

import pytest

from jaxsys_kernel.engine import joining, ports

pytestmark = pytest.mark.unit


def test_a_coordinator_that_listens_is_reached_at_once():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert ports.wait_listening(f"127.0.0.1:{port}", timeout=5.0)


def test_a_port_held_but_not_listening_is_waited_for_until_it_listens():
    """Process 0 holds its coordinator's port (bound, not listening) until JAX serves it."""
    held = ports.hold_port("127.0.0.1")
    port = held.getsockname()[1]
    got = []
    waiter = threading.Thread(
        target=lambda: got.append(ports.wait_listening(f"127.0.0.1:{port}", timeout=30.0))
    )
    waiter.start()
    try:
        # Still waiting while nothing listens: a connection to the held port is refused.
        waiter.join(0.3)
        assert waiter.is_alive() and not got
        held.listen()
        waiter.join(10.0)
        assert got == [True]
    finally:
        held.close()


def test_nothing_listening_ends_the_wait_at_its_timeout():
    held = ports.hold_port("127.0.0.1")
    try:
        assert not ports.wait_listening(f"127.0.0.1:{held.getsockname()[1]}", timeout=0.2)
    finally:
        held.close()
    assert not ports.wait_listening("not-a-port", timeout=0.0)


def test_on_a_pod_jax_is_not_asked_to_detect_what_the_engine_is_told(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert "cluster_detection_method" not in joining.options(None, None)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    got = joining.options("127.0.0.10:1234", 3.0)
    assert got == {
        "coordinator_bind_address": "127.0.0.10:1234",
        "heartbeat_timeout_seconds": 3,
        "cluster_detection_method": "deactivate",
    }
