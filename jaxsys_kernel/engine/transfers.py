"""A cross-host transfer socket of this process's own, for ``jax.device_put`` across processes.

On CPU, JAX moves arrays between processes through a socket set by
``jax_cross_host_transfer_socket_address``; without it such a ``device_put`` is refused,
and with port 0 the receiver never gets the data. When the kernel asks for it
(:data:`jaxsys_kernel.contract.TRANSFER_PORTS`), each process picks a free port on its own
address and sets the option before its backend starts.
"""

from __future__ import annotations

import os
import socket

from .. import contract
from . import ports
from .state import STATE

OPTION = "jax_cross_host_transfer_socket_address"


def transfer_host(coordinator_address: str) -> str:
    """The address the others reach this process on: loopback for a loopback cluster."""
    host = coordinator_address.rsplit(":", 1)[0].strip("[]")
    if host.startswith("127.") or host == "localhost":
        return "127.0.0.1"
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        return host
    outside = [i[4][0] for i in infos if not i[4][0].startswith("127.")]
    return outside[0] if outside else host


def configure(jax, coordinator_address: str, environ=None) -> str | None:
    """Set this process's transfer socket when the cluster asks for one; return it.

    Must run before JAX's backend starts (before ``jax.distributed.initialize``).
    """
    environ = os.environ if environ is None else environ
    if environ.get(contract.TRANSFER_PORTS) != "1":
        return None
    host = transfer_host(coordinator_address)
    STATE.transfer_port = ports.hold_port(host)
    address = f"{host}:{STATE.transfer_port.getsockname()[1]}"
    jax.config.update(OPTION, address)
    return address
