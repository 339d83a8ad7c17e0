"""``%jaxsys start`` names the processes whose jax, jaxlib or numpy differ from the kernel's.

The processes of a 2 x 1 cluster are given a directory on their ``PYTHONPATH`` that holds
the metadata of another numpy (the package itself stays the real one): the start names both
processes and both versions. A start with the kernel's environment says nothing of versions.
"""

from __future__ import annotations

import importlib.metadata

import pytest

from ..harness import Kernel

pytestmark = pytest.mark.slow

START = "%jaxsys start --hosts 2 --devices-per-host 1"


@pytest.fixture(scope="module")
def k(tag):
    kernel = Kernel(tag)
    try:
        yield kernel
    finally:
        kernel.shutdown()


def test_a_process_with_another_numpy_is_named_at_start(k, tmp_path):
    other = tmp_path / "other-env"
    meta = other / "numpy-1.0.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: numpy\nVersion: 1.0.0\n")
    out = k.ok(f"{START} --env PYTHONPATH={other}", timeout=180)
    try:
        mine = importlib.metadata.version("numpy")
        expected = f"p0-1 have numpy 1.0.0, the kernel's environment has {mine}"
        assert expected in out.stderr, out.stderr
        assert "jax " not in out.stderr.split("warning:", 1)[1], out.stderr
    finally:
        k.ok("%jaxsys stop")
    same = k.ok(START, timeout=180)
    assert "the kernel's environment has" not in same.stderr, same.stderr
    assert "could not compare" not in same.stderr, same.stderr
    k.ok("%jaxsys stop")
