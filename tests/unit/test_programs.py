"""The engine's checks on a program's own initialize(), and its %run that raises."""

from __future__ import annotations

import sys

import pytest

from jaxsys_kernel.engine import programs

WORLD = {
    "coordinator_address": "10.0.0.1:1234",
    "num_processes": 2,
    "process_id": 1,
    "local_device_ids": [2, 3],
}


def test_no_arguments_and_agreeing_ones_agree():
    assert programs.disagreements({}, WORLD) == {}
    agreeing = {"num_processes": 2, "process_id": 1, "local_device_ids": [3, 2]}
    assert programs.disagreements({**agreeing, "initialization_timeout": 5}, WORLD) == {}
    assert programs.disagreements({"coordinator_address": "10.0.0.1:1234"}, WORLD) == {}


def test_each_contradicting_argument_is_named_with_the_running_value():
    wrong = programs.disagreements({"num_processes": 4, "process_id": 1}, WORLD)
    assert wrong == {"num_processes": (4, 2)}
    message = programs.refusal(wrong, WORLD)
    assert "num_processes=4 (the running world has 2)" in message
    assert "jaxsys owns the world" in message and "%jaxsys start --hosts N" in message
    assert programs.disagreements({"local_device_ids": 0}, WORLD) == {
        "local_device_ids": (0, [2, 3])
    }


class FakeShell:
    def __init__(self):
        self.calls = []

    def safe_execfile(self, fname, *where, exit_ignore=False, raise_exceptions=False, **kw):
        self.calls.append(raise_exceptions)
        if raise_exceptions:
            raise RuntimeError("from the script")

    def safe_run_module(self, mod_name, where):
        raise AssertionError("replaced")


def test_the_shell_raises_what_a_script_raised_and_argv_is_clean(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["ipengine", "--IPEngine.id=0"])
    shell = FakeShell()
    assert programs.install_shell(shell)
    assert sys.argv == [""]
    with pytest.raises(RuntimeError, match="from the script"):
        shell.safe_execfile("x.py", {})
    # Installing again wraps nothing twice.
    first = shell.safe_execfile
    assert programs.install_shell(shell) and shell.safe_execfile is first
    assert shell.calls == [True]


def test_run_module_raises_and_exit_zero_is_a_normal_end(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    shell = FakeShell()
    programs.install_shell(shell)
    (tmp_path / "failing_mod_x.py").write_text("raise KeyError('inside')\n")
    (tmp_path / "exiting_mod_x.py").write_text("import sys\nvalue = 7\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(KeyError, match="inside"):
        shell.safe_run_module("failing_mod_x", {})
    shell.safe_run_module("exiting_mod_x", {})


def test_a_parameters_cell_is_known_by_papermills_comment_and_its_names_are_read():
    from jaxsys_kernel.magics.parameters import assigned_names, is_parameters_cell

    assert is_parameters_cell("# Parameters\nsteps = 3\n")
    assert is_parameters_cell("\n# parameters\nsteps = 3")
    assert not is_parameters_cell("steps = 3\n# Parameters")
    assert not is_parameters_cell("%%multihost\n# Parameters\nsteps = 3")
    source = '# Parameters\nsteps = 3\nname = "x"\nlr, (a, b) = 0.1, (1, 2)\nn: int = 4\n'
    assert assigned_names(source) == ["steps", "name", "lr", "a", "b", "n"]
    assert assigned_names("# Parameters\nsteps = (") == []


def test_version_differences_name_the_processes_and_both_versions():
    from jaxsys_kernel.magics.versions import differences

    kernel = {"jax": "0.9", "jaxlib": "0.9", "numpy": "2.0"}
    same = {"jax": "0.9", "jaxlib": "0.9", "numpy": "2.0"}
    assert differences(kernel, {0: same, 1: same}) == []
    processes = {0: same, 1: {**same, "jax": "0.8"}, 2: {**same, "jax": "0.8", "numpy": None}}
    assert differences(kernel, processes) == [
        "p1-2 have jax 0.8, the kernel's environment has 0.9",
        "p2 has no numpy, the kernel's environment has 2.0",
    ]
