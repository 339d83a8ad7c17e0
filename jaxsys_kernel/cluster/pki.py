"""Certificates for mutual TLS on JAX's coordination service, one small PKI per cluster.

JAX 0.12 can protect the gRPC channel between ``jax.distributed`` clients and the
coordinator (process 0) with mutual TLS. Each process then needs a certificate, its key and
the CA bundle to trust. :class:`ClusterPKI` makes all of these for one cluster: a private CA
whose key never leaves the kernel's directory, plus one leaf per process whose URI SAN is
``spiffe://jaxsys.local/<cluster_id>/process/<i>``. The environment from
:meth:`ClusterPKI.env` makes a JAX process use them and refuse to run without TLS.

What this protects: cluster bring-up, heartbeats, barriers and the key/value store. It does
not protect the data plane (gloo collectives, cross-host transfers), which JAX sends in
clear text.

This module must not import JAX: the kernel process imports it, and the kernel never
imports JAX.
"""

from __future__ import annotations

import datetime as _dt
import os
import stat
import warnings
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from .. import contract
from . import pki_files as files
from .pki_files import (
    CA_CERT_NAME,
    CA_KEY_NAME,
    TRUST_DOMAIN,
    PKIError,
    ProcessCredentials,
)
from .pki_peer import peer_certificate_serial

__all__ = [
    "TRUST_DOMAIN",
    "ClusterPKI",
    "PKIError",
    "ProcessCredentials",
    "peer_certificate_serial",
]


def _warn_open_keys(cert_dir: Path, nprocs: int) -> None:
    """Warn, at the caller of :meth:`ClusterPKI.from_user`, about keys others can read."""
    for i in range(nprocs):
        key_path = cert_dir / files.key_name(i)
        if stat.S_IMODE(key_path.stat().st_mode) & 0o077:
            warnings.warn(
                f"private key {key_path} is readable by group or others; "
                f"consider `chmod 600 {key_path}`",
                UserWarning,
                stacklevel=3,
            )


class ClusterPKI:
    """The certificates of one cluster: a CA and one leaf certificate per JAX process.

    Build one with :meth:`create` (new CA and leaves), :meth:`load` (reopen what
    :meth:`create` wrote) or :meth:`from_user` (certificates the user brings, no CA key).

    Attributes
    ----------
    cluster_id : str
        Name of the cluster, part of every process's URI SAN.
    nprocs : int
        Number of JAX processes that have certificates.
    cert_dir : pathlib.Path
        Directory holding ``process-<i>.pem`` and ``process-<i>.key``.
    ca_file : pathlib.Path
        The CA certificate (bundle) that every process trusts.
    """

    def __init__(
        self,
        *,
        cluster_id: str,
        nprocs: int,
        cert_dir: Path,
        ca_file: Path,
        peer_uri_prefix: str,
        ca_key_file: Path | None,
    ) -> None:
        # Not meant to be called directly: create/load/from_user check everything first.
        self.cluster_id = cluster_id
        self.nprocs = nprocs
        self.cert_dir = cert_dir
        self.ca_file = ca_file
        self._peer_uri_prefix = peer_uri_prefix
        self._ca_key_file = ca_key_file

    def __repr__(self) -> str:
        return (
            f"ClusterPKI(cluster_id={self.cluster_id!r}, nprocs={self.nprocs}, "
            f"cert_dir='{self.cert_dir}', can_rotate={self.can_rotate})"
        )

    # -- construction -------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        directory: str | os.PathLike,
        cluster_id: str,
        nprocs: int,
        hosts: Sequence[str | Sequence[str]] | None = None,
        *,
        valid_days: float = 30,
    ) -> ClusterPKI:
        """Create a new CA and one certificate per process in ``directory``.

        Parameters
        ----------
        directory : path-like
            Where the files go. Created with mode 0700 if missing; an existing directory
            must be owned by this user and not accessible by group or others. Files
            with the same names already there are overwritten.
        cluster_id : str
            Name of the cluster, 1-128 characters from ``[A-Za-z0-9._-]``.
        nprocs : int
            Number of JAX processes.
        hosts : sequence, optional
            One entry per process: a host name or IP address, or a list of them, to put in
            that process's certificate as DNS or IP SANs. Defaults to ``127.0.0.1`` and
            ``localhost`` for every process.
        valid_days : float, default 30
            Lifetime of the CA and the leaf certificates.

        Returns
        -------
        ClusterPKI

        Raises
        ------
        PKIError
            If ``directory`` is not private to this user.
        ValueError
            If an argument is malformed.
        """
        host_sans = _checked_sans(cluster_id, nprocs, hosts, valid_days)

        directory = Path(directory).absolute()
        files.secure_directory(directory, create=True)

        ca_key, ca_cert = files.new_ca(cluster_id, valid_days)
        files.write_atomic(directory / CA_KEY_NAME, files.key_pem(ca_key), 0o600)
        files.write_atomic(directory / CA_CERT_NAME, files.cert_pem(ca_cert), 0o644)

        pki = cls._in_directory(directory, cluster_id, nprocs)
        for i in range(nprocs):
            pki._issue(i, ca_key, ca_cert, host_sans[i], _dt.timedelta(days=valid_days))
        return pki

    @classmethod
    def _in_directory(cls, directory: Path, cluster_id: str, nprocs: int) -> ClusterPKI:
        """The PKI whose CA and leaves :meth:`create` keeps in ``directory``."""
        return cls(
            cluster_id=cluster_id,
            nprocs=nprocs,
            cert_dir=directory,
            ca_file=directory / CA_CERT_NAME,
            peer_uri_prefix=f"spiffe://{TRUST_DOMAIN}/{cluster_id}/",
            ca_key_file=directory / CA_KEY_NAME,
        )

    @classmethod
    def load(cls, directory: str | os.PathLike, cluster_id: str, nprocs: int) -> ClusterPKI:
        """Reopen a PKI that :meth:`create` wrote.

        Parameters
        ----------
        directory : path-like
            The directory given to :meth:`create`.
        cluster_id : str
            The cluster id given to :meth:`create`.
        nprocs : int
            Number of processes to expect certificates for.

        Returns
        -------
        ClusterPKI

        Raises
        ------
        PKIError
            If the directory is not private, a file is missing or unreadable, or a
            certificate does not match the CA, its key or the cluster id.
        """
        files.check_cluster_id(cluster_id)
        files.check_nprocs(nprocs)
        directory = Path(directory).absolute()
        files.secure_directory(directory, create=False)
        ca_file = directory / CA_CERT_NAME
        ca_key_file = directory / CA_KEY_NAME
        cas = files.load_ca_bundle(ca_file)
        ca_key = files.load_key(ca_key_file, "CA private key (PEM)")
        if files.spki(ca_key.public_key()) != files.spki(cas[0].public_key()):
            raise PKIError(f"CA key {ca_key_file} does not belong to CA certificate {ca_file}")
        pki = cls._in_directory(directory, cluster_id, nprocs)
        # Expired leaves are accepted here so that rotate() can still replace them.
        files.check_leaves(
            cas,
            ca_file,
            directory,
            nprocs,
            expected_prefix=pki._peer_uri_prefix,
            check_validity=False,
        )
        return pki

    @classmethod
    def from_user(
        cls,
        ca_file: str | os.PathLike,
        cert_dir: str | os.PathLike,
        cluster_id: str,
        nprocs: int,
    ) -> ClusterPKI:
        """Use certificates the user brings instead of making new ones.

        ``cert_dir`` must hold ``process-<i>.pem`` (certificate) and ``process-<i>.key``
        (unencrypted PEM key) for every process ``i``. Every certificate must be signed
        by a CA in ``ca_file`` and carry a URI SAN ``<prefix>process/<i>`` with one common
        prefix; the prefix is read from process 0's certificate.

        Parameters
        ----------
        ca_file : path-like
            PEM file with the CA certificate(s) the processes trust.
        cert_dir : path-like
            Directory with the per-process certificates and keys.
        cluster_id : str
            Name of the cluster; a label only, the URI prefix comes from the certificates.
        nprocs : int
            Number of JAX processes.

        Returns
        -------
        ClusterPKI
            Without a CA key, so :meth:`rotate` is unavailable.

        Raises
        ------
        PKIError
            Naming the file that is missing, unreadable or does not fit.
        """
        files.check_cluster_id(cluster_id)
        files.check_nprocs(nprocs)
        ca_file = Path(ca_file).absolute()
        cert_dir = Path(cert_dir).absolute()
        cas = files.load_ca_bundle(ca_file)
        prefix = files.check_leaves(
            cas, ca_file, cert_dir, nprocs, expected_prefix=None, check_validity=True
        )
        _warn_open_keys(cert_dir, nprocs)
        return cls(
            cluster_id=cluster_id,
            nprocs=nprocs,
            cert_dir=cert_dir,
            ca_file=ca_file,
            peer_uri_prefix=prefix,
            ca_key_file=None,
        )

    # -- queries ------------------------------------------------------------------------

    @property
    def peer_uri_prefix(self) -> str:
        """URI SAN prefix that every process of this cluster has; ends with ``/``."""
        return self._peer_uri_prefix

    @property
    def can_rotate(self) -> bool:
        """Whether this PKI holds its CA key and so can issue new certificates."""
        return self._ca_key_file is not None

    def _index(self, i: int) -> int:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.nprocs:
            raise IndexError(f"process index {i!r} out of range for {self.nprocs} processes")
        return i

    def credentials(self, i: int) -> ProcessCredentials:
        """The certificate, key and CA files of process ``i``.

        Parameters
        ----------
        i : int
            Process index, ``0 <= i < nprocs``.

        Returns
        -------
        ProcessCredentials
        """
        i = self._index(i)
        return ProcessCredentials(
            cert_file=str(self.cert_dir / files.cert_name(i)),
            key_file=str(self.cert_dir / files.key_name(i)),
            ca_file=str(self.ca_file),
            uri=f"{self._peer_uri_prefix}process/{i}",
        )

    def env(self, i: int) -> dict[str, str]:
        """Environment variables that make JAX process ``i`` use mutual TLS.

        They set JAX's config options ``jax_mtls_cert_file``, ``jax_mtls_key_file``,
        ``jax_mtls_ca_file``, ``jax_mtls_peer_uri_prefix`` and
        ``jax_distributed_verify_secure_credentials``; the last makes
        ``jax.distributed.initialize`` abort rather than fall back to an insecure channel.

        Parameters
        ----------
        i : int
            Process index.

        Returns
        -------
        dict of str to str
        """
        creds = self.credentials(i)
        return {
            "JAX_MTLS_CERT_FILE": creds.cert_file,
            "JAX_MTLS_KEY_FILE": creds.key_file,
            "JAX_MTLS_CA_FILE": creds.ca_file,
            "JAX_MTLS_PEER_URI_PREFIX": self._peer_uri_prefix,
            "JAX_DISTRIBUTED_VERIFY_SECURE_CREDENTIALS": "1",
        }

    def env_by_rank(self) -> dict[str, str]:
        """What :meth:`env` gives, for processes that all start in one job with one
        environment and learn their rank only then: each still loads its own certificate
        and key, named by a path that the engine completes with its rank.

        Returns
        -------
        dict of str to str
        """
        env = self.env(0)
        del env["JAX_MTLS_CERT_FILE"], env["JAX_MTLS_KEY_FILE"]
        # Placeholders, not process 0's files: a process that cannot fill them in gets
        # no certificate, and JAX then refuses to join (verify_secure_credentials).
        field = contract.RANK_FIELD
        env[contract.MTLS_CERT_TEMPLATE] = str(self.cert_dir / files.cert_name(field))
        env[contract.MTLS_KEY_TEMPLATE] = str(self.cert_dir / files.key_name(field))
        return env

    def certificate(self, i: int) -> x509.Certificate:
        """The current certificate of process ``i``, read from disk.

        Parameters
        ----------
        i : int
            Process index.

        Returns
        -------
        cryptography.x509.Certificate
        """
        i = self._index(i)
        return files.load_cert(self.cert_dir / files.cert_name(i), f"certificate of process {i}")

    def serial(self, i: int) -> int:
        """Serial number of process ``i``'s current certificate.

        Parameters
        ----------
        i : int
            Process index.

        Returns
        -------
        int
        """
        return self.certificate(i).serial_number

    def fingerprint(self, i: int) -> str:
        """SHA-256 fingerprint of process ``i``'s current certificate.

        Parameters
        ----------
        i : int
            Process index.

        Returns
        -------
        str
            Lower-case hex bytes separated by colons.
        """
        return self.certificate(i).fingerprint(hashes.SHA256()).hex(":")

    # -- issuing ------------------------------------------------------------------------

    def _issue(
        self,
        i: int,
        ca_key,
        ca_cert: x509.Certificate,
        host_sans: list[x509.GeneralName],
        lifetime: _dt.timedelta,
    ) -> int:
        uri = f"{self._peer_uri_prefix}process/{i}"
        name = f"jaxsys {self.cluster_id} process {i}"
        key, cert = files.new_leaf(name, uri, ca_key, ca_cert, host_sans, lifetime)
        # Key before certificate: a reader between the two replaces sees a mismatched pair
        # either way, and gRPC keeps its old credentials when a pair does not match.
        files.write_atomic(self.cert_dir / files.key_name(i), files.key_pem(key), 0o600)
        files.write_atomic(self.cert_dir / files.cert_name(i), files.cert_pem(cert), 0o644)
        return cert.serial_number

    def rotate(self, *, valid_days: float | None = None) -> list[int]:
        """Replace every process's key and certificate with new ones from the same CA.

        The files are replaced atomically in place, keeping each certificate's SANs; the CA
        file is untouched. JAX 0.12 re-reads the files about every 10 minutes, so a running
        cluster starts presenting the new certificates only then; until that happens the
        old ones must stay valid.

        Parameters
        ----------
        valid_days : float, optional
            Lifetime of the new certificates; by default the lifetime of the ones they
            replace. Never extends past the CA's own expiry.

        Returns
        -------
        list of int
            The new serial numbers, by process index.

        Raises
        ------
        PKIError
            If this PKI has no CA key (certificates brought by the user).
        """
        if self._ca_key_file is None:
            raise PKIError(
                "cannot rotate certificates brought by the user: jaxsys has no CA key for "
                f"them. Replace the files in {self.cert_dir} yourself (same names, atomic "
                "rename); JAX re-reads them about every 10 minutes"
            )
        if valid_days is not None and valid_days <= 0:
            raise ValueError(f"valid_days must be positive, got {valid_days!r}")
        ca_key = files.load_key(self._ca_key_file, "CA private key (PEM)")
        ca_cert = files.load_ca_bundle(self.ca_file)[0]
        serials = []
        for i in range(self.nprocs):
            old = self.certificate(i)
            san = old.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            host_sans = [g for g in san if not isinstance(g, x509.UniformResourceIdentifier)]
            if valid_days is None:
                lifetime = old.not_valid_after_utc - old.not_valid_before_utc - files.BACKDATE
            else:
                lifetime = _dt.timedelta(days=valid_days)
            serials.append(self._issue(i, ca_key, ca_cert, host_sans, lifetime))
        return serials


def _checked_sans(cluster_id: str, nprocs: int, hosts, valid_days: float) -> list:
    """Check :meth:`ClusterPKI.create`'s arguments; return each process's host SANs."""
    files.check_cluster_id(cluster_id)
    files.check_nprocs(nprocs)
    if valid_days <= 0:
        raise ValueError(f"valid_days must be positive, got {valid_days!r}")
    if hosts is None:
        hosts = [files.DEFAULT_HOST] * nprocs
    if isinstance(hosts, str) or len(hosts) != nprocs:
        raise ValueError(f"hosts must be a list with one entry per process ({nprocs})")
    return [files.host_sans(h) for h in hosts]
