"""The TCP sockets a process listens on: for the endpoint audit, on both sides.

Imports nothing that imports JAX, so the kernel can list its own sockets with it.
"""

from __future__ import annotations

import psutil

__all__ = ["listening_sockets"]


def listening_sockets(pid: int | None = None) -> list[tuple[str, int]]:
    """The TCP sockets a process listens on, as ``(host, port)``; empty if it is gone.

    An IPv4 address seen through an IPv6 socket (``::ffff:127.0.0.1``) is given as IPv4.
    """
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []
    return sorted(
        {
            (c.laddr.ip.removeprefix("::ffff:"), c.laddr.port)
            for c in conns
            if c.status == psutil.CONN_LISTEN
        }
    )
