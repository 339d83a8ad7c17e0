"""What a refused TLS handshake means, in words, for whoever was refused.

Process 0 reports each handshake its coordination service refused with gRPC's TLS error;
the hub keeps one explanation per address and error.
"""

from __future__ import annotations

import re

__all__ = ["explain_refusal"]

# What each TLS error from gRPC means for whoever was refused. The first match wins.
_REFUSAL_REASONS = (
    (
        "no URI SAN with required prefix",
        "its certificate is from the cluster's CA, but for an identity outside this cluster",
    ),
    (
        "Hostname Verification Check failed",
        "its certificate names no identity (URI SAN) of this cluster",
    ),
    ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "it presented no certificate"),
    ("CERTIFICATE_EXPIRED", "its certificate has expired"),
    ("certificate has expired", "its certificate has expired"),
    ("CERTIFICATE_VERIFY_FAILED", "its certificate is not signed by the cluster's CA"),
    (
        "WRONG_VERSION_NUMBER",
        "it does not speak TLS, so it has no certificate (a JAX process without mTLS?)",
    ),
    (
        "HTTP_REQUEST",
        "it does not speak TLS, so it has no certificate (a JAX process without mTLS?)",
    ),
    (
        "Socket closed",
        "it hung up during the handshake: it does not trust the cluster's certificate (a process with another CA?) or is not a TLS client",
    ),
    (
        "Connection reset",
        "it hung up during the handshake: it does not trust the cluster's certificate (a process with another CA?) or is not a TLS client",
    ),
)
_PEER_URIS = re.compile(r"peer URI SANs: \[([^\]]*)\]")


def explain_refusal(error: str) -> tuple[str, str]:
    """Say in words why the coordination service refused a handshake.

    Parameters
    ----------
    error : str
        The TLS error gRPC logged for it.

    Returns
    -------
    tuple of str
        The reason, and the identities (URI SANs) the peer's certificate claimed, or ``""``
        when its certificate did not get that far.
    """
    m = _PEER_URIS.search(error)
    identity = m.group(1).strip() if m else ""
    for needle, reason in _REFUSAL_REASONS:
        if needle in error:
            return reason, identity
    return f"the TLS handshake failed: {error}", identity
