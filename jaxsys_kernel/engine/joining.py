"""How a process joins JAX's distributed runtime: ``initialize``'s options besides the
world's shape, and waiting for process 0's coordination service to listen first."""

from __future__ import annotations

import os

from . import ports


def options(bind_address: str | None, heartbeat_timeout: float | None) -> dict:
    """``jax.distributed.initialize``'s arguments besides the world's shape."""
    kwargs: dict = {}
    if bind_address is not None:
        kwargs["coordinator_bind_address"] = bind_address
    if heartbeat_timeout is not None:
        kwargs["heartbeat_timeout_seconds"] = int(heartbeat_timeout)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        # Every parameter is given: on a pod, JAX's detection would only import the
        # Kubernetes client (1.3 s here, 1.9 s with two pods starting) and find nothing more.
        kwargs["cluster_detection_method"] = "deactivate"
    return kwargs


def own_tls(jax) -> tuple[str, str] | None:
    """This process's mTLS certificate and key for the coordination service, if it has them."""
    cert, key = jax.config.jax_mtls_cert_file, jax.config.jax_mtls_key_file
    return (cert, key) if cert and key else None


def wait_for_coordinator(jax, address: str, timeout: float) -> bool:
    """Wait up to ``timeout`` s until process 0's coordination service at ``address``
    listens (:func:`.ports.wait_listening`), shaking hands with this process's own
    certificate where the service asks for one; whether it did."""
    return ports.wait_listening(address, timeout, own_tls(jax))


__all__ = ["options", "own_tls", "wait_for_coordinator"]
