"""Security on by default: mTLS on the coordination service, CurveZMQ on the control channel,
refused intruders, bring-your-own CA, rotation, the endpoint audit, and a capture on real
(namespaced) network links that shows what is readable on the wire."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import secrets
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from jaxsys_kernel import Cluster, ClusterStartError
from jaxsys_kernel.cluster.audit import audit
from jaxsys_kernel.cluster.pki import ClusterPKI, PKIError, peer_certificate_serial

from .. import netns
from ..harness import run_on as run
from ..harness import tls_knock

SUM_CELL = """
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((jax.device_count(),), ('x',))
local = np.full((jax.local_device_count(),), jax.process_index() + 1.0, np.float32)
arr = jax.make_array_from_process_local_data(NamedSharding(mesh, P('x')), local)
print('total', float(jax.jit(lambda a: a.sum())(arr)))
"""


def _engine_jax_settings():
    import jax

    return (
        jax.config.jax_mtls_cert_file,
        jax.config.jax_mtls_peer_uri_prefix,
        bool(jax.config.jax_distributed_verify_secure_credentials),
    )


def test_default_cluster_uses_mtls_everywhere(cluster):
    assert cluster.secure and cluster.pki is not None
    settings = cluster.view.apply_sync(_engine_jax_settings)
    for rank, (cert, prefix, verify) in enumerate(settings):
        assert cert == cluster.pki.credentials(rank).cert_file
        assert prefix == cluster.pki.peer_uri_prefix
        assert verify
    assert run(cluster, SUM_CELL) == "[p0-1] total 6.0\n"


def test_coordinator_presents_the_cluster_certificate(cluster):
    serial = peer_certificate_serial(cluster.coordinator_address, cluster.pki.credentials(1))
    assert serial == cluster.pki.serial(0)


def test_control_channel_uses_curve(cluster):
    ipp = cluster._ipp
    info = json.loads(
        (
            Path(ipp.profile_dir) / "security" / f"ipcontroller-{ipp.cluster_id}-client.json"
        ).read_text()
    )
    assert info["curve_serverkey"]
    assert cluster.client.curve_serverkey


def test_key_files_are_private(cluster):
    directory = Path(cluster.pki.credentials(0).key_file).parent
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    keys = sorted(directory.glob("*.key"))
    assert len(keys) == 3  # the CA's and one per process
    assert all(stat.S_IMODE(k.stat().st_mode) == 0o600 for k in keys)


def test_audit_covers_every_endpoint(cluster):
    rows = {(e.name, e.protection) for e in audit(cluster)}
    names = {name for name, _ in rows}
    assert ("JAX coordination service", "mTLS") in rows
    assert {"ipyparallel registration", "ipyparallel mux", "ipyparallel iopub"} <= names
    assert all(p == "CurveZMQ" for n, p in rows if n.startswith("ipyparallel"))
    assert ("jaxsys telemetry", "CurveZMQ") in rows
    # Gloo listens once collectives have run (the sum above), and JAX cannot protect it.
    assert any(n.startswith("JAX data plane") and p == "nothing" for n, p in rows)


def _leaf_signed_by(ca_dir: Path, uri: str, out: Path) -> tuple[Path, Path]:
    """A certificate from the cluster's own CA, but for an identity outside its prefix."""
    ca_cert = x509.load_pem_x509_certificate((ca_dir / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "intruder")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    out.mkdir(mode=0o700, exist_ok=True)
    (out / "x.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (out / "x.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return out / "x.pem", out / "x.key"


INTRUDER = textwrap.dedent(
    """
    import sys, jax
    jax.distributed.initialize(sys.argv[1], 2, 1, initialization_timeout=3)
    print("JOINED")
    """
)


def test_intruders_are_refused_and_the_cluster_survives(cluster, tmp_path):
    pki = cluster.pki
    ca_dir = Path(pki.credentials(0).ca_file).parent
    other = ClusterPKI.create(tmp_path / "other", "other", 2)
    wrong_cert, wrong_key = _leaf_signed_by(
        ca_dir, "spiffe://jaxsys.local/elsewhere/process/1", tmp_path / "w"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("JAX_MTLS")}
    base.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    cases = {
        "no certificate": {},
        "another CA": other.env(1),
        "outside the prefix": {
            "JAX_MTLS_CERT_FILE": str(wrong_cert),
            "JAX_MTLS_KEY_FILE": str(wrong_key),
            "JAX_MTLS_CA_FILE": pki.credentials(1).ca_file,
            "JAX_MTLS_PEER_URI_PREFIX": pki.peer_uri_prefix,
        },
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", INTRUDER, cluster.coordinator_address],
            env={**base, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for name, env in cases.items()
    }
    try:
        # While they knock, cells run and their output carries none of gRPC's tracing.
        assert run(cluster, SUM_CELL) == "[p0-1] total 6.0\n"
        tls_knock(cluster.coordinator_address, pki.credentials(1).ca_file)
        for name, p in procs.items():
            out, _ = p.communicate(timeout=60)
            assert p.returncode != 0, f"{name}: {out[-500:]!r}"
            assert b"JOINED" not in out, name
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, 9)
    assert run(cluster, SUM_CELL) == "[p0-1] total 6.0\n"
    assert cluster.status()[1]["state"] == "ready"
    # The kernel knows who was refused and why, by the evidence each handshake left.
    refused = {r["reason"]: r for r in cluster.refusals()}
    assert all(r["host"] == "127.0.0.1" and r["attempts"] >= 1 for r in refused.values())
    reasons = " | ".join(refused)
    assert "does not speak TLS" in reasons  # no certificate: JAX without mTLS
    assert "hung up during the handshake" in reasons  # another CA: it rejects ours first
    assert "presented no certificate" in reasons  # a TLS client with no certificate
    (outside,) = [r for r in refused.values() if "outside this cluster" in r["reason"]]
    assert outside["identity"] == "spiffe://jaxsys.local/elsewhere/process/1"
    # Our own audit connects with the cluster's credentials: never counted as a refusal.
    assert "serving the current certificate" in audit(cluster)[0].advice
    time.sleep(0.5)
    assert sum(r["attempts"] for r in cluster.refusals()) == sum(
        r["attempts"] for r in refused.values()
    )


def _wait_for_refusal(cluster, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while not cluster.refusals():
        assert time.monotonic() < deadline, "no refusal reached the kernel"
        time.sleep(0.1)
    return cluster.refusals()[0]


def test_rotation_replaces_certificates_in_place(cluster):
    before = [cluster.pki.serial(i) for i in cluster.ranks]
    ca_before = Path(cluster.pki.credentials(0).ca_file).read_bytes()
    cluster.rotation_poll = 0.2
    new = cluster.rotate_certs()
    assert new == [cluster.pki.serial(i) for i in cluster.ranks]
    assert not set(new) & set(before)
    assert Path(cluster.pki.credentials(0).ca_file).read_bytes() == ca_before
    # JAX re-reads the files every ~10 minutes; until then the old certificate is served,
    # and new connections signed by the same CA are accepted either way.
    assert (
        peer_certificate_serial(cluster.coordinator_address, cluster.pki.credentials(1))
        == before[0]
    )
    assert run(cluster, SUM_CELL) == "[p0-1] total 6.0\n"
    # The watcher has checked several times by now and, rightly, not seen the new one.
    time.sleep(1.0)
    rotation = cluster.rotation()
    assert rotation["serial"] == new[0]
    assert rotation["in_use_at"] is None and not rotation["gave_up"]


# -- clusters of their own -------------------------------------------------------------------


def test_insecure_cluster_says_so(tag):
    c = Cluster(hosts=2, devices_per_host=1, secure=False, progress=lambda e: None)
    try:
        c.start_sync()
        assert c.security.startswith("INSECURE")
        rows = {e.name: e.protection for e in audit(c)}
        assert rows["JAX coordination service"] == "nothing"
        assert rows["ipyparallel mux"].startswith("HMAC")
        assert rows["jaxsys telemetry"] == "nothing"
        assert c.view.apply_sync(lambda: __import__("jax").config.jax_mtls_cert_file) == [
            None,
            None,
        ]
    finally:
        c.kill()


def test_bring_your_own_ca(tag, tmp_path):
    mine = ClusterPKI.create(tmp_path / "mine", "mylab", 2)
    ca_file = mine.credentials(0).ca_file
    c = Cluster(
        hosts=2,
        devices_per_host=1,
        ca_file=ca_file,
        cert_dir=str(tmp_path / "mine"),
        progress=lambda e: None,
    )
    try:
        c.start_sync()
        assert c.pki.peer_uri_prefix == "spiffe://jaxsys.local/mylab/"
        assert "your CA" in c.security
        assert run(c, SUM_CELL) == "[p0-1] total 3.0\n"
        with pytest.raises(Exception, match="no CA key|cannot rotate|CA key"):
            c.rotate_certs()
    finally:
        c.kill()


def test_missing_certificate_names_the_file(tag, tmp_path):
    mine = ClusterPKI.create(tmp_path / "mine", "mylab", 2)
    os.remove(mine.credentials(1).key_file)
    c = Cluster(
        hosts=2,
        devices_per_host=1,
        ca_file=mine.credentials(0).ca_file,
        cert_dir=str(tmp_path / "mine"),
        progress=lambda e: None,
    )
    with pytest.raises(PKIError, match="process-1.key"):
        c.start_sync()
    assert c.state == "stopped"


def test_verify_secure_credentials_failure_is_a_clear_error(tag):
    # Process 1 loses its certificate: JAX must refuse to fall back to plaintext.
    c = Cluster(
        hosts=2,
        devices_per_host=1,
        process_env={1: {"JAX_MTLS_CERT_FILE": ""}},
        progress=lambda e: None,
        init_timeout=20,
    )
    with pytest.raises(ClusterStartError) as info:
        c.start_sync()
    msg = str(info.value)
    assert "process 1" in msg
    assert (
        "Insecure gRPC credentials" in msg or "verify_secure_credentials" in msg or "mTLS" in msg
    ), msg


def test_a_process_turned_away_at_start_is_explained(tag, tmp_path):
    # Process 1 carries another cluster's credentials: it can never join. The start fails
    # at its deadline, and the error says what the coordination service saw meanwhile.
    other = ClusterPKI.create(tmp_path / "other", "other", 2)
    c = Cluster(
        hosts=2,
        devices_per_host=1,
        process_env={1: other.env(1)},
        progress=lambda e: None,
        init_timeout=3,
    )
    with pytest.raises(ClusterStartError) as info:
        c.start_sync()
    msg = str(info.value)
    assert "process 1" in msg
    assert re.search(
        r"meanwhile the coordination service refused \d+ connection\(s\) from 127\.0\.0\.1: "
        r"it hung up during the handshake",
        msg,
    ), msg
    assert c.state == "stopped"


# -- real links ----------------------------------------------------------------------------


@pytest.mark.slow
def test_payloads_on_real_links(tag, tmp_path):
    reason = netns.available(need_capture=True)
    if reason:
        pytest.skip(f"network namespaces are not available here: {reason}")
    kv_marker = f"KV-{secrets.token_hex(6)}"
    cell_marker = f"CELL-{secrets.token_hex(6)}"
    gloo_marker = f"GLOO-{secrets.token_hex(6)}"
    # Hosts 0-2 run the cluster; host 3 is an intruder on the same network.
    with netns.TestHosts(4) as hosts:
        c = Cluster(
            hosts=3,
            devices_per_host=1,
            addresses=hosts.host_addresses[:3],
            controller_ip=hosts.bridge_address,
            process_prefix={i: hosts.exec_prefix(i) for i in range(3)},
            progress=lambda e: None,
        )
        try:
            c.start_sync()
            assert c.coordinator_address.startswith(hosts.host_addresses[0] + ":")
            with netns.Capture(hosts.bridge, tmp_path / "links.pcap") as cap:
                out = run(
                    c,
                    SUM_CELL
                    + textwrap.dedent(
                        f"""
                        from jax._src import distributed
                        from jax.experimental import multihost_utils
                        note = {cell_marker!r}
                        client = distributed.global_state.client
                        if jax.process_index() == 0:
                            client.key_value_set("probe", {kv_marker!r})
                        assert client.blocking_key_value_get("probe", 20000) == {kv_marker!r}
                        data = np.frombuffer({gloo_marker!r}.encode() * 64, np.uint8)
                        gathered = multihost_utils.process_allgather(data)
                        print('gathered', gathered.shape)
                        """
                    ),
                )
            assert "[p0-2] total 6.0" in out and "[p0-2] gathered (3, 1088)" in out
            knock = hosts.popen(
                3,
                [sys.executable, "-c", INTRUDER, c.coordinator_address],
                timeout=30,
                env={
                    **{k: v for k, v in os.environ.items() if not k.startswith("JAX_MTLS")},
                    "JAX_PLATFORMS": "cpu",
                },
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                refused = _wait_for_refusal(c, timeout=20)
            finally:
                netns.kill_group(knock)
        finally:
            c.kill()
    # Named by its own address on the link, not by a cluster host's.
    assert refused["host"] == hosts.host_addresses[3]
    assert "does not speak TLS" in refused["reason"]
    payload = cap.payload_bytes()
    assert payload, "nothing was captured on the links"
    assert kv_marker.encode() not in payload, "the coordination service leaked the KV value"
    assert cell_marker.encode() not in payload, "the control channel leaked cell source"
    # Documented limitation: JAX sends CPU collectives (gloo) in plaintext.
    assert gloo_marker.encode() in payload
