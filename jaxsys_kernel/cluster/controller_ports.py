"""The controller's ports: picked by the kernel and held until the cluster stops.

ipyparallel's controller finds each of its ports free by binding port 0 and closing the
socket, and binds it again later, in the process that serves it. In between the port is
free for anyone: an outgoing connection anywhere on the machine may take it as its local
port, or another process bind it. The queue that then fails to bind ends ("Address already
in use") while the controller runs on without it. Measured here: 4 of 708 local starts, three
starting at a time on 2 cores; one of them had lost the queue that carries requests to the
engines, which then registered and never answered.

So the kernel picks the ports and keeps each bound, not listening, with ``SO_REUSEADDR``:
while it is bound the system gives the port to no outgoing connection and to no bind of port
0, and the controller's own bind still succeeds (ZeroMQ sets ``SO_REUSEADDR`` on what it
binds). The ports are drawn below 49152, where ipyparallel's engines bind ports picked at
random (ZeroMQ's ``bind_to_random_port``), so none of those lands on one either.
"""

from __future__ import annotations

import socket

# ipyparallel's engines bind ports drawn at random from here up to 65535.
RANDOM_BINDS_FROM = 49152
# Draws of port 0 at most, per port wanted, looking for ports below RANDOM_BINDS_FROM (on
# Linux's default range about 6 in 10 draws give one; where the system gives none, the
# sockets open at once stay few).
DRAWS_PER_PORT = 4


def count(depth: int) -> int:
    """How many ports ipyparallel's controller binds with a broadcast tree of ``depth``:
    registration, six queues for the engines and one per leaf scheduler, six channels for
    clients, one per inner scheduler, and the monitor."""
    return 1 + 6 + 2**depth + 6 + (2 ** (depth + 1) - 2) + 1


def hold(n: int) -> list[socket.socket]:
    """``n`` sockets, each bound (not listening) to a port of its own on every interface;
    fewer (possibly none) where the system gives no more. Close them to let the ports go."""
    held: list[socket.socket] = []
    high: list[socket.socket] = []  # above RANDOM_BINDS_FROM: kept bound while drawing
    try:
        for _ in range(DRAWS_PER_PORT * n):
            if len(held) >= n:
                break
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", 0))
            except OSError:
                s.close()
                break
            (held if s.getsockname()[1] < RANDOM_BINDS_FROM else high).append(s)
        # Short of ports below the engines' range: a port held anywhere is still safer
        # than one found free and let go.
        while len(held) < n and high:
            held.append(high.pop())
    finally:
        for s in high:
            s.close()
    return held


def option(held: list[socket.socket]) -> str:
    """The controller's command-line option that makes it bind the ``held`` ports first."""
    return "--IPController.ports=" + ",".join(str(s.getsockname()[1]) for s in held)


def release(held: list[socket.socket]) -> None:
    """Let the ports go (the controller keeps those it bound)."""
    for s in held:
        s.close()


__all__ = ["count", "hold", "option", "release"]
