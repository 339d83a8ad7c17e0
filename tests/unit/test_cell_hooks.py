"""The engine's per-cell hook registry, in a real IPython shell (no engines)."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jaxsys_kernel.engine import hooks
from jaxsys_kernel.errors import EngineError


@pytest.fixture
def shell():
    sh = InteractiveShell.instance()
    assert hooks.install()
    return sh


@pytest.fixture
def calls():
    log: list = []
    hooks.register(
        hooks.Hook(
            "probe",
            before=lambda opts: log.append(("before", opts)) or opts.get("tag"),
            after=lambda state: log.append(("after", state)),
            error=lambda state, exc: log.append(("error", state, type(exc).__name__)),
        )
    )
    hooks.register(hooks.Hook("broken", before=lambda opts: 1 / 0))
    yield log
    hooks._registry.pop("probe", None)
    hooks._registry.pop("broken", None)


def test_wrap_leaves_a_cell_without_hooks_alone():
    assert hooks.wrap("x = 1", None) == "x = 1"
    assert hooks.wrap("x = 1", {}) == "x = 1"


def test_wrap_and_parse_round_trip():
    code = "a = 1\nb = 2"
    sent = hooks.wrap(code, {"probe": {"tag": 3}})
    assert sent.startswith(hooks.MARKER)
    assert hooks.parse(sent) == ({"probe": {"tag": 3}}, code)


def test_a_bad_marker_line_is_a_clear_error():
    with pytest.raises(EngineError, match="not JSON"):
        hooks.parse(hooks.MARKER + "{nope\nx = 1")
    with pytest.raises(EngineError, match="option dicts"):
        hooks.parse(hooks.MARKER + '{"probe": 1}\nx = 1')


def test_before_and_after_run_around_the_cell(shell, calls):
    result = shell.run_cell(hooks.wrap("x_hooks = 41 + 1", {"probe": {"tag": "t"}}))
    assert result.success
    assert shell.user_ns["x_hooks"] == 42
    assert calls == [("before", {"tag": "t"}), ("after", "t")]


def test_error_hook_sees_the_cells_exception_and_its_own_line_numbers(shell, calls):
    result = shell.run_cell(hooks.wrap("a = 1\nraise KeyError('k')", {"probe": {}}))
    assert not result.success
    assert calls[-1] == ("error", None, "KeyError")
    # The marker line is gone before compiling: the raise is on the user's line 2.
    assert result.error_in_exec.__traceback__.tb_next.tb_lineno == 2


def test_a_cell_without_the_marker_runs_no_hook(shell, calls):
    shell.run_cell("y_hooks = 1")
    assert calls == []


def test_a_failing_hook_does_not_stop_the_cell_or_the_others(shell, calls, capsys):
    result = shell.run_cell(hooks.wrap("z_hooks = 5", {"broken": {}, "probe": {}}))
    assert result.success and shell.user_ns["z_hooks"] == 5
    assert ("after", None) in calls
    assert "the broken hook failed before the cell" in capsys.readouterr().err


def test_an_unknown_hook_is_named(shell, calls, capsys):
    shell.run_cell(hooks.wrap("pass", {"nosuch": {}}))
    assert "no cell hook named 'nosuch'" in capsys.readouterr().err


def test_arm_next_runs_hooks_around_the_next_cell_only(shell, calls):
    assert hooks.arm_next({"probe": {"tag": 1}})
    shell.run_cell("pass")
    shell.run_cell("pass")
    assert calls == [("before", {"tag": 1}), ("after", 1)]


def test_the_builtin_hooks_are_one_entry_each():
    assert {"thread_guard", "divergence", "profile"} <= set(hooks.registered())
