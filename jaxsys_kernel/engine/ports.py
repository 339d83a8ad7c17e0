"""Ports a process picks now and a server binds later, held so that nobody takes them between."""

from __future__ import annotations

import socket
import ssl
import time

# Seconds between attempts to reach a coordinator that is not listening yet.
LISTEN_POLL_S = 0.01


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


def wait_listening(address: str, timeout: float, tls: tuple[str, str] | None = None) -> bool:
    """Wait until something accepts connections at ``address`` (``host:port``); whether it
    did within ``timeout`` seconds.

    JAX's processes call ``jax.distributed.initialize`` together, and one that asks for the
    coordination service before process 0 listens waits for gRPC's reconnect backoff (about
    1 s on a local cluster, 2 s between pods, measured) although process 0 listened a few
    milliseconds later. A connection, closed at once, tells when it listens. With mTLS
    (``tls``: this process's certificate and key files) it completes a handshake with them
    first: the service reports every connection that hangs up during one as refused.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    context = None
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        # Only whether it listens: the join itself checks the service's certificate.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.load_cert_chain(*tls)
        context.set_alpn_protocols(["h2"])
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0) as conn:
                if context is not None:
                    context.wrap_socket(conn).close()
                return True
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return False
        time.sleep(LISTEN_POLL_S)
