"""``%%multihost?`` says how a script written for ``python`` runs on every process."""

from __future__ import annotations

import pytest

from jaxsys_kernel.magics.magics import JaxSysMagics

pytestmark = pytest.mark.unit


def test_the_help_shows_run_with_an_example():
    doc = JaxSysMagics.multihost.__doc__
    assert "%%multihost\n    %run train.py --steps 3\n" in doc
    assert "runs a script written for ``python`` unchanged" in " ".join(doc.split())
