"""Tests of the per-cluster PKI: files, certificate contents, rotation, bring-your-own
certificates, and (slow) real JAX processes talking mutual TLS with the certificates."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from jaxsys_kernel.cluster.pki import (
    ClusterPKI,
    PKIError,
    ProcessCredentials,
    peer_certificate_serial,
)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _cert(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(Path(path).read_bytes())


def _ext(cert: x509.Certificate, cls):
    return cert.extensions.get_extension_for_class(cls)


@pytest.fixture
def pki(tmp_path) -> ClusterPKI:
    hosts = ["127.0.0.1", "node1.example", ["10.0.0.2", "node2", "::1"]]
    return ClusterPKI.create(tmp_path / "pki", "c42", 3, hosts)


# -- create ------------------------------------------------------------------------------


def test_create_file_modes(pki):
    d = pki.cert_dir
    assert _mode(d) == 0o700
    names = sorted(p.name for p in d.iterdir())
    assert names == sorted(
        ["ca.pem", "ca.key"] + [f"process-{i}.{e}" for i in range(3) for e in ("pem", "key")]
    )
    for p in d.glob("*.key"):
        assert _mode(p) == 0o600, p
        text = p.read_text()
        assert text.startswith("-----BEGIN PRIVATE KEY-----")  # PKCS8, unencrypted
        key = serialization.load_pem_private_key(text.encode(), None)
        assert isinstance(key.curve, ec.SECP256R1)


def test_create_makes_missing_parents(tmp_path):
    old = os.umask(0o022)
    try:
        p = ClusterPKI.create(tmp_path / "a" / "b", "x", 1)
    finally:
        os.umask(old)
    assert _mode(p.cert_dir) == 0o700
    assert _mode(p.cert_dir / "process-0.key") == 0o600


def test_ca_certificate(pki):
    ca = _cert(pki.ca_file)
    bc = _ext(ca, x509.BasicConstraints)
    assert bc.critical and bc.value.ca
    ku = _ext(ca, x509.KeyUsage).value
    assert ku.key_cert_sign and ku.crl_sign and not ku.digital_signature
    cn = ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert cn == "jaxsys cluster c42 CA"
    assert ca.issuer == ca.subject
    ca.verify_directly_issued_by(ca)
    assert isinstance(ca.public_key().curve, ec.SECP256R1)


def test_leaf_sans(pki):
    def sans(i):
        return _ext(pki.certificate(i), x509.SubjectAlternativeName).value

    for i in range(3):
        uris = sans(i).get_values_for_type(x509.UniformResourceIdentifier)
        assert uris == [f"spiffe://jaxsys.local/c42/process/{i}"]
        assert pki.credentials(i).uri == uris[0]
    assert sans(0).get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert sans(0).get_values_for_type(x509.DNSName) == []
    assert sans(1).get_values_for_type(x509.DNSName) == ["node1.example"]
    assert sans(1).get_values_for_type(x509.IPAddress) == []
    assert sans(2).get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.2"),
        ipaddress.ip_address("::1"),
    ]
    assert sans(2).get_values_for_type(x509.DNSName) == ["node2"]


def test_default_hosts(tmp_path):
    p = ClusterPKI.create(tmp_path / "d", "c", 2)
    for i in range(2):
        san = _ext(p.certificate(i), x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
        assert san.get_values_for_type(x509.DNSName) == ["localhost"]


def test_leaf_chain_and_constraints(pki):
    ca = _cert(pki.ca_file)
    now = dt.datetime.now(dt.UTC)
    for i in range(3):
        leaf = pki.certificate(i)
        leaf.verify_directly_issued_by(ca)
        bc = _ext(leaf, x509.BasicConstraints)
        assert bc.critical and not bc.value.ca
        assert set(_ext(leaf, x509.ExtendedKeyUsage).value) == {
            ExtendedKeyUsageOID.SERVER_AUTH,
            ExtendedKeyUsageOID.CLIENT_AUTH,
        }
        backdate = now - leaf.not_valid_before_utc
        assert dt.timedelta(minutes=4) < backdate < dt.timedelta(minutes=6)
        lifetime = leaf.not_valid_after_utc - now
        assert dt.timedelta(days=29) < lifetime <= dt.timedelta(days=30)
        key = serialization.load_pem_private_key(
            Path(pki.credentials(i).key_file).read_bytes(), None
        )
        assert key.public_key() == leaf.public_key()
    assert len({pki.serial(i) for i in range(3)}) == 3


def test_prefix_credentials_env(pki):
    assert pki.peer_uri_prefix == "spiffe://jaxsys.local/c42/"
    c = pki.credentials(1)
    assert c == ProcessCredentials(
        cert_file=str(pki.cert_dir / "process-1.pem"),
        key_file=str(pki.cert_dir / "process-1.key"),
        ca_file=str(pki.cert_dir / "ca.pem"),
        uri="spiffe://jaxsys.local/c42/process/1",
    )
    assert "ca.key" not in repr(c)
    assert pki.env(1) == {
        "JAX_MTLS_CERT_FILE": c.cert_file,
        "JAX_MTLS_KEY_FILE": c.key_file,
        "JAX_MTLS_CA_FILE": c.ca_file,
        "JAX_MTLS_PEER_URI_PREFIX": "spiffe://jaxsys.local/c42/",
        "JAX_DISTRIBUTED_VERIFY_SECURE_CREDENTIALS": "1",
    }
    with pytest.raises(IndexError):
        pki.credentials(3)
    with pytest.raises(IndexError):
        pki.env(-1)


def test_env_names_are_jax_options():
    # The env var names are JAX config option names in upper case; check they exist in the
    # installed JAX source without importing JAX into the test process.
    import importlib.util

    spec = importlib.util.find_spec("jax")
    assert spec is not None and spec.origin is not None
    config_src = (Path(spec.origin).parent / "_src" / "config.py").read_text()
    for name in [
        "jax_mtls_cert_file",
        "jax_mtls_key_file",
        "jax_mtls_ca_file",
        "jax_mtls_peer_uri_prefix",
        "jax_distributed_verify_secure_credentials",
    ]:
        assert f"name='{name}'" in config_src, name


def test_create_refuses_open_directory(tmp_path):
    for mode in (0o755, 0o750, 0o701):
        d = tmp_path / f"open{mode:o}"
        d.mkdir()
        os.chmod(d, mode)
        with pytest.raises(PKIError, match=rf"{d}.*group or others.*{mode:04o}"):
            ClusterPKI.create(d, "c", 1)
        assert list(d.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory away")
def test_create_refuses_directory_of_another_user(tmp_path):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    with pytest.raises(PKIError, match=r"owned by uid 65534"):
        ClusterPKI.create(d, "c", 1)
    assert list(d.iterdir()) == []


def test_create_accepts_private_existing_directory(tmp_path):
    d = tmp_path / "mine"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o700)
    ClusterPKI.create(d, "c", 1)
    assert (d / "process-0.pem").exists()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(cluster_id="a/b", nprocs=1), "cluster_id"),
        (dict(cluster_id="", nprocs=1), "cluster_id"),
        (dict(cluster_id="..", nprocs=1), "cluster_id"),
        (dict(cluster_id="c", nprocs=0), "nprocs"),
        (dict(cluster_id="c", nprocs=2, hosts=["127.0.0.1"]), "one entry per process"),
        (dict(cluster_id="c", nprocs=1, hosts=["bad host"]), "host"),
        (dict(cluster_id="c", nprocs=1, valid_days=0), "valid_days"),
    ],
)
def test_create_rejects_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ClusterPKI.create(tmp_path / "p", **kwargs)


# -- rotate and load ---------------------------------------------------------------------


def test_rotate(pki):
    ca_before = pki.ca_file.read_bytes()
    old = [pki.serial(i) for i in range(3)]
    old_fp = [pki.fingerprint(i) for i in range(3)]
    old_keys = [Path(pki.credentials(i).key_file).read_bytes() for i in range(3)]
    old_sans = [_ext(pki.certificate(i), x509.SubjectAlternativeName).value for i in range(3)]
    new = pki.rotate()
    assert new == [pki.serial(i) for i in range(3)]
    assert not set(new) & set(old)
    assert all(pki.fingerprint(i) != old_fp[i] for i in range(3))
    assert pki.ca_file.read_bytes() == ca_before
    ca = _cert(pki.ca_file)
    for i in range(3):
        leaf = pki.certificate(i)
        leaf.verify_directly_issued_by(ca)
        assert _ext(leaf, x509.SubjectAlternativeName).value == old_sans[i]
        key_file = pki.credentials(i).key_file
        assert Path(key_file).read_bytes() != old_keys[i]
        assert _mode(key_file) == 0o600
        lifetime = leaf.not_valid_after_utc - dt.datetime.now(dt.UTC)
        assert dt.timedelta(days=29) < lifetime <= dt.timedelta(days=30)
    assert not [p for p in pki.cert_dir.iterdir() if p.name.startswith(".")]


def test_rotate_with_lifetime_capped_by_ca(pki):
    pki.rotate(valid_days=1)
    assert pki.certificate(0).not_valid_after_utc - dt.datetime.now(dt.UTC) < dt.timedelta(days=1)
    pki.rotate(valid_days=365)
    assert pki.certificate(0).not_valid_after_utc == _cert(pki.ca_file).not_valid_after_utc


def test_load(pki):
    again = ClusterPKI.load(pki.cert_dir, "c42", 3)
    assert again.peer_uri_prefix == pki.peer_uri_prefix
    assert [again.serial(i) for i in range(3)] == [pki.serial(i) for i in range(3)]
    assert again.rotate() == [pki.serial(i) for i in range(3)]
    with pytest.raises(PKIError, match=r"process-0\.pem lacks the URI SAN"):
        ClusterPKI.load(pki.cert_dir, "other", 3)
    with pytest.raises(PKIError, match=r"process-3\.pem does not exist"):
        ClusterPKI.load(pki.cert_dir, "c42", 4)
    os.chmod(pki.cert_dir, 0o755)
    with pytest.raises(PKIError, match="group or others"):
        ClusterPKI.load(pki.cert_dir, "c42", 3)


# -- bring your own ----------------------------------------------------------------------


def _user_ca(cn="Corp CA"):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _user_certs(directory: Path, nprocs: int, uri=None, ca=None) -> Path:
    """Write a CA file and ``process-<i>.pem/.key`` like a user would; return the CA file."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = ca or _user_ca()
    now = dt.datetime.now(dt.UTC)
    for i in range(nprocs):
        key = ec.generate_private_key(ec.SECP256R1())
        names = [x509.DNSName(f"host{i}.corp.example")]
        if uri is not None:
            names.append(x509.UniformResourceIdentifier(uri(i)))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"p{i}")]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        (directory / f"process-{i}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file = directory / f"process-{i}.key"
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        os.chmod(key_file, 0o600)
    ca_file = directory / "corp-ca.pem"
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    return ca_file


def _spiffe(i):
    return f"spiffe://corp.example/ml/jax/process/{i}"


def test_from_user_happy_path(tmp_path):
    ca_file = _user_certs(tmp_path / "mine", 2, uri=_spiffe)
    p = ClusterPKI.from_user(ca_file, tmp_path / "mine", "byo", 2)
    assert p.peer_uri_prefix == "spiffe://corp.example/ml/jax/"
    assert not p.can_rotate
    c = p.credentials(1)
    assert c.cert_file == str(tmp_path / "mine" / "process-1.pem")
    assert c.ca_file == str(ca_file)
    assert c.uri == _spiffe(1)
    assert p.env(0)["JAX_MTLS_PEER_URI_PREFIX"] == "spiffe://corp.example/ml/jax/"
    assert p.serial(0) == _cert(tmp_path / "mine" / "process-0.pem").serial_number
    with pytest.raises(PKIError, match="cannot rotate certificates brought by the user"):
        p.rotate()


def test_from_user_accepts_ca_bundle_and_our_own_files(tmp_path, pki):
    ca_file = _user_certs(tmp_path / "mine", 2, uri=_spiffe)
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(pki.ca_file.read_bytes() + ca_file.read_bytes())
    ClusterPKI.from_user(bundle, tmp_path / "mine", "byo", 2)
    p = ClusterPKI.from_user(pki.ca_file, pki.cert_dir, "anything", 3)
    assert p.peer_uri_prefix == pki.peer_uri_prefix


@pytest.mark.parametrize("missing", ["process-1.key", "process-0.pem", "corp-ca.pem"])
def test_from_user_missing_file(tmp_path, missing):
    ca_file = _user_certs(tmp_path / "mine", 2, uri=_spiffe)
    (tmp_path / "mine" / missing).unlink()
    with pytest.raises(PKIError, match=rf"missing .*{missing} does not exist") as e:
        ClusterPKI.from_user(ca_file, tmp_path / "mine", "byo", 2)
    expected = {"process-1.key": "private key of process 1", "process-0.pem": "certificate"}
    assert expected.get(missing, "CA certificate") in str(e.value)


def test_from_user_unreadable_file(tmp_path):
    ca_file = _user_certs(tmp_path / "mine", 2, uri=_spiffe)
    key = tmp_path / "mine" / "process-1.key"
    key.unlink()
    key.mkdir()
    with pytest.raises(PKIError, match=rf"private key of process 1.*{key} is not a regular file"):
        ClusterPKI.from_user(ca_file, tmp_path / "mine", "byo", 2)
    if os.geteuid() != 0:  # root reads files whatever their mode
        key.rmdir()
        key.write_text("x")
        os.chmod(key, 0)
        with pytest.raises(PKIError, match=rf"cannot read .*{key}"):
            ClusterPKI.from_user(ca_file, tmp_path / "mine", "byo", 2)


def test_from_user_wrong_ca(tmp_path):
    _user_certs(tmp_path / "mine", 2, uri=_spiffe)
    other_ca = _user_certs(tmp_path / "other", 1, uri=_spiffe)
    cert = tmp_path / "mine" / "process-0.pem"
    with pytest.raises(PKIError, match=rf"{cert} is not signed by any CA in {other_ca}"):
        ClusterPKI.from_user(other_ca, tmp_path / "mine", "byo", 2)


def test_from_user_one_cert_from_another_ca(tmp_path):
    ca_file = _user_certs(tmp_path / "mine", 2, uri=_spiffe)
    _user_certs(tmp_path / "other", 2, uri=_spiffe)
    for ext in ("pem", "key"):
        shutil.copy(tmp_path / "other" / f"process-1.{ext}", tmp_path / "mine")
    with pytest.raises(PKIError, match=r"process-1\.pem is not signed"):
        ClusterPKI.from_user(ca_file, tmp_path / "mine", "byo", 2)


def test_from_user_no_uri_san(tmp_path):
    ca_file = _user_certs(tmp_path / "mine", 2, uri=None)
    with pytest.raises(PKIError, match=r"process-0\.pem has no URI SAN .*process/0"):
        ClusterPKI.from_user(ca_file, tmp_path / "mine", "byo", 2)


def test_from_user_inconsistent_prefix(tmp_path):
    def uri(i):
        return _spiffe(i) if i == 0 else f"spiffe://elsewhere.example/process/{i}"

    ca_file = _user_certs(tmp_path / "mine", 2, uri=uri)
    with pytest.raises(PKIError, match=r"process-1\.pem lacks the URI SAN .*corp\.example"):
        ClusterPKI.from_user(ca_file, tmp_path / "mine", "byo", 2)


def test_from_user_key_of_another_cert(tmp_path):
    ca_file = _user_certs(tmp_path / "mine", 2, uri=_spiffe)
    d = tmp_path / "mine"
    shutil.copy(d / "process-1.key", d / "process-0.key")
    with pytest.raises(PKIError, match=r"process-0\.key does not belong to .*process-0\.pem"):
        ClusterPKI.from_user(ca_file, d, "byo", 2)


# -- probing a TLS server ----------------------------------------------------------------


def _tls_server(creds: ProcessCredentials):
    """A one-connection-at-a-time mTLS server in a thread; returns (port, stop)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(creds.cert_file, creds.key_file)
    ctx.load_verify_locations(creds.ca_file)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(["h2"])
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(2)
            try:
                with ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError):
                pass
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], stop


def test_peer_certificate_serial_local_server(pki, tmp_path):
    port, stop = _tls_server(pki.credentials(0))
    try:
        assert peer_certificate_serial(f"127.0.0.1:{port}", pki.credentials(1)) == pki.serial(0)
        stranger = ClusterPKI.create(tmp_path / "stranger", "c42", 2)
        with pytest.raises(ssl.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
            peer_certificate_serial(f"127.0.0.1:{port}", stranger.credentials(1))
    finally:
        stop.set()
    with pytest.raises(ValueError, match="host:port"):
        peer_certificate_serial("127.0.0.1", pki.credentials(1))
