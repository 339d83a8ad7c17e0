"""Ports a process picks now and a server binds later, held so that nobody takes them between."""

from __future__ import annotations

import socket


def hold_port(host: str) -> socket.socket:
    """A socket bound, not listening, to a free port on ``host``; the port is its own.

    A port merely found free can be handed to someone else (another bind to port 0, or any
    outgoing connection's local port) before the process meant to serve it binds it.
    While this socket stays bound the kernel gives the port to nobody else, yet with
    ``SO_REUSEPORT`` a server of the same user can still bind it: gRPC (so JAX's
    coordination service) and JAX's transfer sockets set that option on their listeners.

    Parameters
    ----------
    host : str
        Address to bind; the empty string means every interface.

    Returns
    -------
    socket.socket
        The bound socket; close it to let the port go.
    """
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        s.bind((host, 0))
    except OSError:
        s.close()
        raise
    return s
