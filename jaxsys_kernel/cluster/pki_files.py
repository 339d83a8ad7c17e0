"""The files and checks behind a cluster's PKI: private directories, atomic writes, PEM
loading, certificate checks and the CA itself (see ``pki.py``).

This module must not import JAX (the kernel imports it).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import ipaddress
import os
import re
import secrets
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..errors import ConfigError

TRUST_DOMAIN = "jaxsys.local"

CA_CERT_NAME = "ca.pem"
CA_KEY_NAME = "ca.key"

# Certificates may be issued slightly in the past so that a peer whose clock runs a little
# behind does not reject them as "not yet valid".
BACKDATE = _dt.timedelta(minutes=5)

# The id becomes one path segment of the SPIFFE URI; a "/" in it would let one cluster's
# prefix match another cluster's certificates.
_CLUSTER_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

_PROCESS_URI_RE = re.compile(r"^(?P<prefix>.+/)process/(?P<index>[0-9]+)$")

DEFAULT_HOST = ("127.0.0.1", "localhost")


class PKIError(ConfigError, RuntimeError):
    """Certificates or key files are missing, unreadable, insecure or inconsistent."""


@dataclass
class ProcessCredentials:
    """The files one JAX process needs for mutual TLS.

    Attributes
    ----------
    cert_file : str
        PEM certificate of the process.
    key_file : str
        PEM (PKCS8) private key for ``cert_file``.
    ca_file : str
        PEM bundle of the CA certificate(s) that peers must chain to.
    uri : str
        The SPIFFE URI SAN in ``cert_file`` that identifies the process.
    """

    cert_file: str
    key_file: str
    ca_file: str
    uri: str


def utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def cert_name(i: int | str) -> str:
    return f"process-{i}.pem"


def key_name(i: int | str) -> str:
    return f"process-{i}.key"


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` so that readers see either the old or the new file."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    # The mode is set at creation, so a key is never readable by others even for a moment.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            # The umask may have taken bits away that a certificate is meant to have.
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def spki(public_key) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def check_cluster_id(cluster_id: str) -> None:
    if not isinstance(cluster_id, str) or not _CLUSTER_ID_RE.fullmatch(cluster_id):
        raise ValueError(
            f"cluster_id must be 1-128 characters from [A-Za-z0-9._-] starting with a letter "
            f"or digit, got {cluster_id!r}"
        )


def check_nprocs(nprocs: int) -> None:
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError(f"nprocs must be a positive integer, got {nprocs!r}")


def host_sans(host: str | Iterable[str]) -> list[x509.GeneralName]:
    """SAN entries for one process's host: IP literals as IPAddress, others as DNSName."""
    names = [host] if isinstance(host, str) else list(host)
    if not names:
        raise ValueError("each entry of hosts must name at least one host")
    sans: list[x509.GeneralName] = []
    for name in names:
        if not isinstance(name, str) or not name.strip() or any(c.isspace() for c in name):
            raise ValueError(f"not a host name or IP address: {name!r}")
        # "[::1]" is how IPv6 addresses appear in host:port strings.
        literal = name[1:-1] if name.startswith("[") and name.endswith("]") else name
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(literal)))
        except ValueError:
            try:
                sans.append(x509.DNSName(name))
            except ValueError as e:
                raise ValueError(f"not a usable DNS name for a certificate: {name!r}: {e}") from e
    return sans


def secure_directory(directory: Path, *, create: bool) -> None:
    """Make sure ``directory`` is a 0700 directory owned by us (creating it if asked)."""
    if create:
        try:
            directory.mkdir(mode=0o700, parents=True)
        except FileExistsError:
            pass
        else:
            # mkdir's mode is filtered by the umask; pin it to exactly 0700.
            os.chmod(directory, 0o700)
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        raise PKIError(f"PKI directory {directory} does not exist") from None
    if not stat.S_ISDIR(st.st_mode):
        raise PKIError(f"PKI path {directory} exists but is not a directory")
    if st.st_uid != os.geteuid():
        raise PKIError(
            f"PKI directory {directory} is owned by uid {st.st_uid}, not by this user "
            f"(uid {os.geteuid()}); refusing to keep private keys there"
        )
    if st.st_mode & 0o077:
        raise PKIError(
            f"PKI directory {directory} is accessible by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):04o}); it must be mode 0700. Use a new "
            f"directory, or run `chmod 700 {directory}` if its contents can be trusted"
        )


def _read_file(path: Path, what: str) -> bytes:
    """Read ``path``, turning any failure into a PKIError that says what was expected."""
    if not path.exists():
        raise PKIError(f"missing {what}: {path} does not exist")
    if not path.is_file():
        raise PKIError(f"{what} {path} is not a regular file")
    try:
        return path.read_bytes()
    except OSError as e:
        raise PKIError(f"cannot read {what} {path}: {e.strerror or e}") from e


def load_ca_bundle(path: Path) -> list[x509.Certificate]:
    data = _read_file(path, "CA certificate bundle (PEM)")
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise PKIError(f"CA file {path} holds no readable PEM certificate: {e}") from e
    return certs


def load_cert(path: Path, what: str) -> x509.Certificate:
    data = _read_file(path, what)
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as e:
        raise PKIError(f"{what} {path} is not a PEM certificate: {e}") from e


def load_key(path: Path, what: str):
    data = _read_file(path, what)
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError as e:
        # gRPC cannot be given a passphrase, so an encrypted key is unusable for JAX.
        raise PKIError(f"{what} {path} is encrypted; JAX needs an unencrypted key") from e
    except ValueError as e:
        raise PKIError(f"{what} {path} is not a PEM private key: {e}") from e


def _uris(cert: x509.Certificate) -> list[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return ext.value.get_values_for_type(x509.UniformResourceIdentifier)


def _issued_by(cert: x509.Certificate, cas: Sequence[x509.Certificate]) -> bool:
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return True
    return False


def _eku(cert: x509.Certificate) -> set | None:
    try:
        return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        return None


def _first_prefix(cert_path: Path, uris: list[str]) -> str:
    """The prefix of process 0's URI SAN ``<prefix>process/0``."""
    found = [m["prefix"] for u in uris if (m := _PROCESS_URI_RE.match(u)) and m["index"] == "0"]
    if not found:
        raise PKIError(
            f"certificate {cert_path} has no URI SAN of the form "
            f"'<prefix>/process/0' (found URI SANs: {uris or 'none'}); JAX's peer "
            f"check needs one, e.g. 'spiffe://example.org/jax/process/0'"
        )
    return found[0]


def _check_usage(cert_path: Path, cert: x509.Certificate, *, coordinator: bool) -> None:
    """Refuse a certificate whose extended key usage (when it has one) forbids its role."""
    eku = _eku(cert)
    if eku is None:
        return
    if ExtendedKeyUsageOID.CLIENT_AUTH not in eku:
        raise PKIError(f"certificate {cert_path} does not allow TLS client auth (EKU)")
    if coordinator and ExtendedKeyUsageOID.SERVER_AUTH not in eku:
        raise PKIError(
            f"certificate {cert_path} does not allow TLS server auth (EKU); "
            f"process 0 runs the coordinator and needs it"
        )


def check_leaves(
    cas: Sequence[x509.Certificate],
    ca_file: Path,
    cert_dir: Path,
    nprocs: int,
    *,
    expected_prefix: str | None,
    check_validity: bool,
) -> str:
    """Validate every process's certificate and key; return the common URI prefix."""
    prefix = expected_prefix
    now = utc_now()
    for i in range(nprocs):
        cert_path = cert_dir / cert_name(i)
        key_path = cert_dir / key_name(i)
        cert = load_cert(cert_path, f"certificate of process {i} (PEM)")
        key = load_key(key_path, f"private key of process {i} (PEM, unencrypted)")
        if spki(key.public_key()) != spki(cert.public_key()):
            raise PKIError(f"private key {key_path} does not belong to certificate {cert_path}")
        if not _issued_by(cert, cas):
            raise PKIError(
                f"certificate {cert_path} is not signed by any CA in {ca_file} "
                f"(issuer: {cert.issuer.rfc4514_string()})"
            )
        uris = _uris(cert)
        if prefix is None:
            # Process 0's certificate defines the prefix every other process must share.
            prefix = _first_prefix(cert_path, uris)
        want = f"{prefix}process/{i}"
        if want not in uris:
            raise PKIError(
                f"certificate {cert_path} lacks the URI SAN {want!r} "
                f"(found URI SANs: {uris or 'none'})"
            )
        _check_usage(cert_path, cert, coordinator=i == 0)
        if check_validity and not (cert.not_valid_before_utc <= now <= cert.not_valid_after_utc):
            raise PKIError(
                f"certificate {cert_path} is not valid now: valid from "
                f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} to "
                f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
            )
    assert prefix is not None
    return prefix


def new_ca(cluster_id: str, valid_days: float):
    """A new CA key and self-signed certificate that may sign process certificates only."""
    now = utc_now()
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"jaxsys cluster {cluster_id} CA")]
    )
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + _dt.timedelta(days=valid_days))
        # path_length=0: this CA signs process certificates only, never another CA.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return ca_key, ca_cert


def new_leaf(
    common_name: str,
    uri: str,
    ca_key,
    ca_cert: x509.Certificate,
    host_sans: list[x509.GeneralName],
    lifetime: _dt.timedelta,
):
    """A new key and a process certificate for it, signed by the CA: the URI SAN is its
    identity, the host SANs where it runs; good for TLS server and client alike."""
    now = utc_now()
    # A leaf that outlives its CA would fail verification anyway; stop where the CA does.
    not_after = min(now + lifetime, ca_cert.not_valid_after_utc)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri), *host_sans]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert
