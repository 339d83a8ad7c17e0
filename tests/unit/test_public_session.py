"""``jaxsys_kernel.session()``: the public way to reach the kernel's cluster from a cell."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import jaxsys_kernel
from jaxsys_kernel.magics import current_session


def test_session_outside_a_jaxsys_shell_says_what_to_do():
    with pytest.raises(RuntimeError, match="load_ext jaxsys_kernel"):
        current_session(SimpleNamespace())


def test_session_is_the_shells_jaxsys_session(monkeypatch):
    marker = object()
    shell = SimpleNamespace(_jaxsys_session=marker)
    assert current_session(shell) is marker
    monkeypatch.setattr("IPython.get_ipython", lambda: shell)
    assert jaxsys_kernel.session() is marker
