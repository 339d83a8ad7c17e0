"""Exported computations: the card's facts, save/load, calls checked against constraints.

JAX runs in a child process with four CPU devices (this test process never imports JAX); the
card, its text and HTML forms and the dimension arithmetic are checked here directly.
"""

from __future__ import annotations

import pytest

from jaxsys_kernel.export import _solve_linear, check_constraint, evaluate_dim
from jaxsys_kernel.widgets import ArtifactView

# -- dimension arithmetic (no JAX) -----------------------------------------------------------


def test_dimension_expressions_evaluate_as_jax_prints_them():
    env = {"a": 6, "b": 4}
    assert evaluate_dim("4*b + 1", env) == 17
    assert evaluate_dim("mod(a, 4)", env) == 2
    assert evaluate_dim("floordiv(a, b)", env) == 1
    assert evaluate_dim("b^2", env) == 16
    assert evaluate_dim("max(a, b) - min(a, b)", env) == 2
    with pytest.raises(KeyError):
        evaluate_dim("c", env)
    with pytest.raises(ValueError, match="not a dimension expression"):
        evaluate_dim("__import__('os')", env)


def test_linear_dimensions_are_solved_for_their_symbol():
    assert _solve_linear("4*b", "b", 12) == 3
    assert _solve_linear("2*b + 1", "b", 9) == 4
    assert _solve_linear("4*b", "b", 6) is None  # not a multiple
    assert _solve_linear("b^2", "b", 9) is None  # not linear: left to JAX


def test_constraints_hold_fail_or_cannot_tell():
    assert check_constraint("b <= 16", {"b": 16}) is True
    assert check_constraint("b <= 16", {"b": 17}) is False
    assert check_constraint("a >= b", {"a": 2, "b": 3}) is False
    assert check_constraint("a * b == c", {"a": 2, "b": 3, "c": 6}) is True
    assert check_constraint("b <= 16", {}) is None


def test_card_refuses_other_summaries():
    import traitlets

    with pytest.raises(traitlets.TraitError, match="export"):
        ArtifactView({"kind": "mesh"})
