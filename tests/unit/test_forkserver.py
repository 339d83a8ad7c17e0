"""The fork server's decisions, without forking: which requests it serves, how JAX settings
that differ reach a child, and the package whose ``__init__`` waits until it is needed."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

from jaxsys_kernel import _compat
from jaxsys_kernel.cluster.launchers import forks
from jaxsys_kernel.engine import forked, forkserver

IMPORTED = {"JAX_PLATFORMS": "cpu"}


def _request(**env):
    # What the server compares with its own environment, as the server has it.
    same = ("JAXSYS_PARENT_PID", "PYTHONPATH")
    parent = {k: os.environ[k] for k in same if os.environ.get(k)}
    return {"argv": ["--IPEngine.id=0"], "env": {**IMPORTED, **parent, **env}, "cwd": "/"}


def test_a_request_like_the_servers_is_served():
    assert forkserver.refusal(_request(JAXSYS_PROCESS_ID="3"), IMPORTED) is None
    assert forkserver.jax_changes(_request()["env"], IMPORTED) == {}


def test_a_jax_option_that_differs_is_served_and_named_as_a_change():
    req = _request(JAX_MTLS_CERT_FILE="/certs/p1.pem")
    assert forkserver.refusal(req, IMPORTED) is None
    assert forkserver.jax_changes(req["env"], IMPORTED) == {"JAX_MTLS_CERT_FILE": "/certs/p1.pem"}


def test_a_jax_variable_that_is_no_option_is_refused_by_name():
    why = forkserver.refusal(_request(JAX_SOMETHING_JAX_DOES_NOT_DECLARE="1"), IMPORTED)
    assert why and "JAX_SOMETHING_JAX_DOES_NOT_DECLARE" in why


def test_a_setting_the_request_drops_is_refused():
    req = {"argv": [], "env": {"PATH": "/bin"}}
    why = forkserver.refusal(req, IMPORTED)
    assert why and "JAX_PLATFORMS" in why and "unset" in why


def test_a_request_for_another_parent_is_refused(monkeypatch):
    monkeypatch.setenv("JAXSYS_PARENT_PID", "100")
    assert "another parent" in forkserver.refusal(_request(JAXSYS_PARENT_PID="1"), IMPORTED)
    assert forkserver.refusal(_request(JAXSYS_PARENT_PID="100"), IMPORTED) is None


def test_a_malformed_request_is_refused():
    assert "no environment" in forkserver.refusal({"argv": "x"}, IMPORTED)


def test_another_pythonpath_is_refused(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/a")
    assert "PYTHONPATH" in forkserver.refusal(_request(PYTHONPATH="/b"), IMPORTED)


class _Holder:
    def __init__(self, value):
        self.value = value


class _Config:
    def __init__(self, **values):
        self._value_holders = {k: _Holder(v) for k, v in values.items()}
        self.updates = {}

    def update(self, name, value):
        self.updates[name] = value


@pytest.mark.parametrize(
    ("current", "text", "parsed"),
    [(False, "true", True), (True, "0", False), (3, "7", 7), (0.5, "2.5", 2.5), (None, "x", "x")],
)
def test_an_option_is_set_from_its_variable_as_jax_parses_it(current, text, parsed):
    config = _Config(jax_foo=current)
    _compat.set_jax_option_from_env(config, "JAX_FOO", text)
    assert config.updates == {"jax_foo": parsed}
    assert type(config.updates["jax_foo"]) is type(parsed)


def test_a_variable_without_an_option_has_none():
    assert _compat.jax_option(_Config(jax_foo=1), "JAX_BAR") is None
    assert _compat.jax_option(object(), "JAX_FOO") is None


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / "lazypkg_demo"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("RAN = True\nfrom . import heavy\n")
    (root / "heavy.py").write_text("VALUE = 42\n")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "leaf.py").write_text("from lazypkg_demo import heavy as h\nLEAF = h.VALUE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "lazypkg_demo"
    for name in [m for m in sys.modules if m.startswith("lazypkg_demo")]:
        del sys.modules[name]


def test_a_lazy_package_imports_submodules_without_its_init(package):
    forkserver.lazy_package(package)
    # Deferred: the package exists only once the fixture wrote it.
    import lazypkg_demo.sub.leaf as leaf

    assert leaf.LEAF == 42
    mod = sys.modules[package]
    assert "RAN" not in mod.__dict__
    # A name only its __init__ defines runs it, once.
    assert mod.RAN is True
    assert type(mod) is types.ModuleType


def test_the_stand_in_imports_only_the_standard_library():
    source = Path(forked.__file__).read_text()
    imported = {
        line.split()[1].split(".")[0]
        for line in source.splitlines()
        if line.startswith(("import ", "from "))
    }
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_the_stand_in_is_run_by_path_without_site():
    class _Proc:
        pid = 4321

    server = forks.ForkServer.__new__(forks.ForkServer)
    server.socket_path, server.ready_wait, server.proc = "/tmp/s", 30.0, _Proc()
    cmd = server.engine_cmd()
    assert cmd[1:3] == ["-S", forked.__file__]
    assert cmd[3:] == ["/tmp/s", "4321", "30"]


def test_the_stand_in_asks_for_its_arguments():
    assert forked.main([]) == 2
