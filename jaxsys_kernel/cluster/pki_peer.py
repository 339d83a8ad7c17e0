"""Which certificate a TLS server presents: how jaxsys sees a rotation take effect."""

from __future__ import annotations

import socket
import ssl

from cryptography import x509

from .pki_files import ProcessCredentials

__all__ = ["peer_certificate_serial"]


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address must look like 'host:port', got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def peer_certificate_serial(address: str, creds: ProcessCredentials, timeout: float = 5.0) -> int:
    """Serial number of the certificate a TLS server (e.g. JAX's coordinator) presents.

    Connects as a TLS client with ``creds`` as the client certificate and trusts only
    ``creds.ca_file``. Host names are not checked (the coordinator's identity is its URI
    SAN), but the server's certificate must chain to the CA.

    Parameters
    ----------
    address : str
        ``"host:port"`` of the server; IPv6 hosts in brackets.
    creds : ProcessCredentials
        Client certificate, key and CA to use.
    timeout : float, default 5.0
        Seconds allowed for connecting and the handshake.

    Returns
    -------
    int
        The serial number of the server's certificate.

    Raises
    ------
    ssl.SSLError
        If the handshake fails, e.g. the server's certificate is not from the CA.
    OSError
        If the server cannot be reached.
    """
    host, port = _split_address(address)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cafile=creds.ca_file)
    ctx.load_cert_chain(certfile=creds.cert_file, keyfile=creds.key_file)
    # gRPC servers only complete handshakes that negotiate HTTP/2.
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection((host, port), timeout=timeout) as sock:
        with ctx.wrap_socket(sock, server_hostname=None) as tls:
            der = tls.getpeercert(binary_form=True)
    if der is None:
        raise ssl.SSLError(f"{address} presented no certificate")
    return x509.load_der_x509_certificate(der).serial_number
