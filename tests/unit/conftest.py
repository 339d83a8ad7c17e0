"""Fixtures the unit tests of the magics share: IPython's test shell, and the jaxsys magics
registered on it over the session fake built from the real session's signatures."""

from __future__ import annotations

import pytest
from IPython.testing import globalipapp

from jaxsys_kernel.magics.magics import JaxSysMagics

from ..fakes import FakeSession


@pytest.fixture(scope="module")
def shell():
    return globalipapp.start_ipython() or globalipapp.get_ipython()


@pytest.fixture
def session(shell):
    fake = FakeSession()
    shell.register_magics(JaxSysMagics(shell, fake))
    return fake
