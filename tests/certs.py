"""What certificate each process of a cluster loaded for mTLS: a cell that reads it on
every process, and the check that each process has its own, naming its rank."""

from __future__ import annotations

import re

CERT_CELL = """
import jax
from cryptography import x509
with open(jax.config.jax_mtls_cert_file, 'rb') as _f:
    _cert = x509.load_pem_x509_certificate(_f.read())
_san = _cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
print('process', jax.process_index(), 'certificate',
      *_san.get_values_for_type(x509.UniformResourceIdentifier), 'serial', _cert.serial_number)
"""
_LINE = re.compile(r"^\[p(\d+)\] process (\d+) certificate (\S+) serial (\d+)$")


def assert_one_certificate_per_process(out: str, nprocs: int) -> None:
    """``out``, the collated output of :data:`CERT_CELL`, shows each of ``nprocs``
    processes with a certificate of its own that names its rank."""
    seen = {}
    for line in out.splitlines():
        m = _LINE.match(line)
        assert m, f"not a certificate line: {line!r} in\n{out}"
        shown, rank, uri, serial = m.groups()
        assert shown == rank, out
        assert uri.endswith(f"/process/{rank}"), f"process {rank} presents {uri}:\n{out}"
        seen[int(rank)] = serial
    assert sorted(seen) == list(range(nprocs)), out
    assert len(set(seen.values())) == nprocs, f"processes share a certificate:\n{out}"
