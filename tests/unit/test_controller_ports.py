"""The controller's ports: held by the kernel, out of reach of other binds, open to ZeroMQ's."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import zmq

from jaxsys_kernel.cluster import controller_ports


@pytest.fixture
def held():
    socks = controller_ports.hold(controller_ports.count(0))
    yield socks
    controller_ports.release(socks)


def test_as_many_ports_as_the_controller_binds_each_its_own(held):
    ports = [s.getsockname()[1] for s in held]
    # Registration, 6 + 1 engine queues, 6 client channels, the monitor (depth 0).
    assert len(ports) == controller_ports.count(0) == 15
    assert controller_ports.count(1) == 15 + 1 + 2
    assert len(set(ports)) == len(ports)
    if _low_ports_given():
        assert all(p < controller_ports.RANDOM_BINDS_FROM for p in ports), ports
    assert controller_ports.option(held) == "--IPController.ports=" + ",".join(map(str, ports))


def _low_ports_given() -> bool:
    """Whether this system gives ports of its own below the engines' random range."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    return low < controller_ports.RANDOM_BINDS_FROM - 1024


def test_a_held_port_is_refused_to_others_and_bound_by_zeromq(held):
    port = held[0].getsockname()[1]
    other = socket.socket()
    with pytest.raises(OSError):
        other.bind(("127.0.0.1", port))
    other.close()
    ctx = zmq.Context()
    try:
        router = ctx.socket(zmq.ROUTER)
        router.bind(f"tcp://127.0.0.1:{port}")  # as the controller's queues bind
        router.close(linger=0)
    finally:
        ctx.term()


def test_released_ports_are_free_again(held):
    port = held[0].getsockname()[1]
    controller_ports.release(held)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.close()
