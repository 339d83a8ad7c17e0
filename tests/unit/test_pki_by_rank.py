"""Launchers that start every rank with one environment (MPI, Slurm) still give each
process its own certificate and key: the engine completes the paths with its rank."""

from __future__ import annotations

import pytest
from cryptography import x509

from jaxsys_kernel import contract
from jaxsys_kernel.cluster.config import ClusterConfig
from jaxsys_kernel.cluster.launchers import make_launcher
from jaxsys_kernel.cluster.launchers.base import EngineContext
from jaxsys_kernel.cluster.pki import ClusterPKI
from jaxsys_kernel.engine import bootstrap

RANK_VARS = list(contract.RANK_VARIABLES)


@pytest.fixture
def pki(tmp_path):
    return ClusterPKI.create(tmp_path / "pki", "c1", 2)


def _uris(path: str) -> list[str]:
    with open(path, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.UniformResourceIdentifier)


def _engine_environment(monkeypatch, env: dict[str, str], rank_var: str, rank: int) -> None:
    """This process's environment as an engine started with ``env`` would see it."""
    for name in [*RANK_VARS, "JAX_MTLS_CERT_FILE", "JAX_MTLS_KEY_FILE"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(rank_var, str(rank))


@pytest.mark.parametrize(
    ("launcher", "rank_var"), [("mpi", "OMPI_COMM_WORLD_RANK"), ("slurm", "SLURM_PROCID")]
)
def test_each_rank_of_one_job_loads_its_own_certificate(monkeypatch, pki, launcher, rank_var):
    env = make_launcher(ClusterConfig(hosts=2, launcher=launcher)).one_job_env(
        EngineContext(incarnation=1, pki=pki)
    )
    # Process 0's files are not handed to every rank.
    assert "JAX_MTLS_CERT_FILE" not in env and "JAX_MTLS_KEY_FILE" not in env
    assert env["JAX_DISTRIBUTED_VERIFY_SECURE_CREDENTIALS"] == "1"
    seen = {}
    for rank in (0, 1):
        _engine_environment(monkeypatch, env, rank_var, rank)
        bootstrap.own_credentials()
        creds = pki.credentials(rank)
        assert bootstrap.os.environ["JAX_MTLS_CERT_FILE"] == creds.cert_file
        assert bootstrap.os.environ["JAX_MTLS_KEY_FILE"] == creds.key_file
        seen[rank] = _uris(creds.cert_file)
    assert seen[0] != seen[1] and seen[1][0].endswith("process/1")


def test_a_missing_certificate_is_named(monkeypatch, pki):
    env = make_launcher(ClusterConfig(hosts=2, launcher="mpi")).one_job_env(
        EngineContext(incarnation=1, pki=pki)
    )
    _engine_environment(monkeypatch, env, "OMPI_COMM_WORLD_RANK", 5)
    with pytest.raises(RuntimeError, match="process 5 has no mTLS certificate at .*process-5.pem"):
        bootstrap.own_credentials()
    assert "JAX_MTLS_CERT_FILE" not in bootstrap.os.environ


def test_the_users_own_certificate_is_kept(monkeypatch, pki):
    config = ClusterConfig(hosts=2, launcher="mpi", env={"JAX_MTLS_CERT_FILE": "mine.pem"})
    env = make_launcher(config).one_job_env(EngineContext(incarnation=1, pki=pki))
    assert env["JAX_MTLS_CERT_FILE"] == "mine.pem"
    assert contract.MTLS_CERT_TEMPLATE not in env
