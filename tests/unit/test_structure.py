"""The package's shape: sizes, one exception family, every module in a layer, and the
primitives that make each thing be done one way (Cluster.call, the magic boundary, the
engine-function registry)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pickle
import pkgutil
import tomllib
from types import SimpleNamespace

import pytest
from IPython.core.error import UsageError

from jaxsys_kernel.cluster.calls import Calls, EngineCalls, ProcessNotRunning
from jaxsys_kernel.errors import ClusterError, ConfigError, JaxsysError
from jaxsys_kernel.magics.boundary import usage_boundary, usage_errors

from .package_source import PACKAGE, ROOT, source_files, text, tree

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def test_no_module_or_function_is_too_long():
    long_modules, long_functions = [], []
    for path in source_files():
        lines = text(path).count("\n")
        if lines > MAX_MODULE_LINES:
            long_modules.append(f"{path.relative_to(ROOT)} ({lines} lines)")
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n})"
                    )
    assert not long_modules, f"modules over {MAX_MODULE_LINES} lines: {long_modules}"
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines: {long_functions}"


def _package_modules():
    for info in pkgutil.walk_packages([str(PACKAGE)], "jaxsys_kernel."):
        if info.name.endswith("__main__"):
            continue
        yield importlib.import_module(info.name)


def test_every_exception_is_a_jaxsys_error():
    # MultihostInterrupt is a KeyboardInterrupt on purpose: `except Exception` must not
    # swallow an interrupted cell.
    allowed = {"MultihostInterrupt"}
    strays = []
    for module in _package_modules():
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
                and name not in allowed
                and not issubclass(obj, JaxsysError)
            ):
                strays.append(f"{module.__name__}.{name}")
    assert not strays, f"exceptions outside the JaxsysError family: {strays}"


def test_every_top_level_module_sits_in_a_layer():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["id"] == "layers")["layers"]
    named = {part.strip() for layer in layers for part in layer.split("|")}
    top = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()
    }
    missing = top - named - {"__init__", "__main__"}
    assert not missing, f"modules in no layer of the import contract: {sorted(missing)}"
    assert not any("ignore_imports" in c for c in contracts), "the contracts need no exceptions"


def test_every_data_module_is_on_a_side():
    # data/ is split: the planner's modules are kernel-side, the loaders engine-side.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = {c["id"]: c for c in config["tool"]["importlinter"]["contracts"]}
    sides = set(contracts["kernel-side-no-jax"]["source_modules"])
    sides |= set(contracts["engine-not-kernel-side"]["source_modules"])
    modules = {f"jaxsys_kernel.data.{p.stem}" for p in (PACKAGE / "data").glob("[!_]*.py")}
    assert modules - sides == set(), "data modules on neither side of the import contracts"


# -- Cluster.call ---------------------------------------------------------------------------


class _Reply:
    def __init__(self, value):
        self.value = value

    def get(self, timeout=None):
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value

    def ready(self):
        return True


class _Engine:
    def __init__(self, value):
        self.value, self.sent = value, []

    def apply_async(self, fn, *args, **kwargs):
        self.sent.append((fn, args, kwargs))
        return _Reply(self.value(*args) if callable(self.value) else self.value)


class _Cluster(EngineCalls):
    """Three processes whose engines answer at once; ``call`` and ``submit`` are real."""

    def __init__(self, answers, states=("ready", "ready", "ready")):
        self.processes = [
            SimpleNamespace(rank=r, state=s, engine_id=10 + r) for r, s in enumerate(states)
        ]
        self.ranks = list(range(len(states)))
        self.nprocs = len(states)
        self.client = {10 + r: _Engine(a) for r, a in enumerate(answers)}

    def _require_ready(self):
        pass

    def _check_rank(self, rank):
        if not 0 <= rank < self.nprocs:
            raise ClusterError(f"there is no process {rank}")


def test_call_gathers_results_errors_and_silence_by_rank():
    import ipyparallel

    late = ipyparallel.error.TimeoutError("late")
    cluster = _Cluster([lambda x: x + 1, ValueError("bad"), late])
    calls = cluster.call(None, abs, 41, timeout=0.1)
    assert calls.results == {0: 42}
    assert isinstance(calls.errors[1], ValueError)
    assert calls.missing == [2]
    assert not calls.ok
    with pytest.raises(ClusterError, match="process 2 did not answer within 0.1 s"):
        calls.values()
    assert cluster.call([0], abs, 1).values() == {0: 2}


def test_call_refuses_a_process_that_is_not_running_before_sending_anything():
    cluster = _Cluster([1, 2, 3], states=("ready", "dead", "ready"))
    with pytest.raises(ProcessNotRunning, match="process 1 is dead"):
        cluster.call([0, 1], abs, 1)
    assert cluster.client[10].sent == []
    with pytest.raises(ClusterError, match="no process 7"):
        cluster.call([7], abs, 1)


def test_calls_reraise_the_first_error_in_rank_order():
    calls = Calls(errors={2: KeyError("b"), 1: ValueError("a")})
    with pytest.raises(ValueError):
        calls.raise_first()


# -- the magic boundary -----------------------------------------------------------------------


def test_the_boundary_turns_user_errors_into_usage_errors_once():
    @usage_boundary
    class Session:
        def start(self):
            raise ConfigError("devices_per_host must be at least 1")

        def fail_cell(self):
            raise JaxsysError("a cell's own failure keeps its traceback")

        def _private(self):
            raise ClusterError("not converted")

    with pytest.raises(UsageError, match="devices_per_host"):
        Session().start()
    with pytest.raises(JaxsysError):
        Session().fail_cell()
    with pytest.raises(ClusterError):
        Session()._private()
    wrapped = usage_errors(Session.start)
    assert usage_errors(wrapped) is wrapped


def test_the_session_and_the_dispatcher_are_the_boundary():
    from jaxsys_kernel.magics import actions
    from jaxsys_kernel.magics.session import MultihostSession

    assert getattr(MultihostSession.start, "_jaxsys_boundary", False)
    assert getattr(MultihostSession.kill_process, "_jaxsys_boundary", False)
    assert getattr(actions.dispatch, "_jaxsys_boundary", False)


# -- the engine-function registry ---------------------------------------------------------


def test_engine_functions_are_named_without_importing_them_and_compare_to_the_real_ones():
    from jaxsys_kernel.engine import output
    from jaxsys_kernel.engine.registry import ENGINE_FUNCTIONS, engine_module

    f = engine_module("output").log_tail
    assert pickle.loads(pickle.dumps(f)) == f == output.log_tail
    with pytest.raises(AttributeError, match="not an engine function"):
        getattr(engine_module("output"), "no_such_function")  # noqa: B009 - the name is the test
    for module, names in ENGINE_FUNCTIONS.items():
        real = importlib.import_module(f"jaxsys_kernel.engine.{module}")
        assert all(callable(getattr(real, n, None)) for n in names), module


def test_kernel_side_modules_name_engine_functions_through_the_registry():
    # Importing one of these modules only to name a function is what the registry is for.
    from jaxsys_kernel.engine.registry import ENGINE_FUNCTIONS

    sent = {f"engine.{m}" for m in ENGINE_FUNCTIONS} | set(ENGINE_FUNCTIONS)
    kernel_side = ["kernel", "magics", "cells", "cluster", "telemetry", "widgets"]
    offenders = []
    for part in kernel_side:
        for path in (p for p in source_files() if PACKAGE / part in p.parents):
            for node in ast.walk(tree(path)):
                if not isinstance(node, ast.ImportFrom) or not node.module:
                    continue
                module = node.module.removeprefix("jaxsys_kernel.")
                names = {f"{module}.{a.name}" for a in node.names} | {module}
                if module.endswith("engine") or any(n.split(".", 1)[-1] in sent for n in names):
                    if names & {f"engine.{m}" for m in ENGINE_FUNCTIONS} or module in sent:
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {module}")
    assert not offenders, f"kernel-side imports of engine modules the registry names: {offenders}"
