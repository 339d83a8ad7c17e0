"""The engine functions the kernel side may run, named without importing them.

The kernel never imports JAX, yet it sends engine functions (which import JAX where they
run) through ``Cluster.call``. Importing their modules only to name them would put JAX's
importers on the kernel side. Instead the kernel names them here: ``engine_module("cache")``
is a stand-in whose attributes are picklable :class:`EngineFunction` objects; on the engine
the real module is imported and the function called. This module imports nothing that
imports JAX.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ENGINE_FUNCTIONS", "EngineFunction", "engine_module"]

# Every engine function the kernel side runs, by module (under jaxsys_kernel.engine).
ENGINE_FUNCTIONS: dict[str, frozenset[str]] = {
    "bootstrap": frozenset(
        {"describe_process", "free_port", "initialize", "take_over", "wait_booted"}
    ),
    "probes": frozenset(
        {"describe_value", "fetch_value", "complete", "inspect", "network_endpoints", "user_names"}
    ),
    "cache": frozenset({"list_entries", "clear_entries", "set_thresholds", "describe"}),
    "guards": frozenset({"set_transfer_guard", "state", "arm_thread_guard"}),
    "barrier": frozenset({"wait"}),
    "output": frozenset({"log_tail", "log_path"}),
    "profiling": frozenset({"clock", "discard", "trace_info", "read_trace", "start", "stop"}),
    "arrivals": frozenset({"disable", "enable", "records", "slow"}),
    "readiness": frozenset({"state"}),
    "spare": frozenset({"swap_in"}),
}


class EngineFunction:
    """A picklable reference to ``jaxsys_kernel.engine.<module>.<name>``, called where it runs.

    It compares equal to the function it names, so a test double that records the functions
    it was sent can compare them with the real ones.
    """

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str):
        if name not in ENGINE_FUNCTIONS.get(module, ()):
            known = ", ".join(sorted(ENGINE_FUNCTIONS.get(module, ()))) or "none"
            raise AttributeError(
                f"jaxsys_kernel.engine.{module}.{name} is not an engine function the kernel may "
                f"run (known in {module}: {known}); add it to ENGINE_FUNCTIONS"
            )
        self.module, self.name = module, name

    @property
    def qualified(self) -> str:
        """``jaxsys_kernel.engine.<module>.<name>``."""
        return f"{__package__}.{self.module}.{self.name}"

    def resolve(self):
        """The real function (imports its module: call this only where JAX may be imported)."""
        return getattr(importlib.import_module(f"{__package__}.{self.module}"), self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __getstate__(self):
        return (self.module, self.name)

    def __setstate__(self, state) -> None:
        self.module, self.name = state

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EngineFunction):
            return (self.module, self.name) == (other.module, other.name)
        named = f"{getattr(other, '__module__', '')}.{getattr(other, '__qualname__', '')}"
        return named == self.qualified

    def __hash__(self) -> int:
        return hash(self.qualified)

    def __repr__(self) -> str:
        return f"<engine function {self.qualified}>"


class _EngineModule:
    """The stand-in for one engine module on the kernel side."""

    def __init__(self, module: str):
        if module not in ENGINE_FUNCTIONS:
            raise ValueError(f"no engine module {module!r}; known: {', '.join(ENGINE_FUNCTIONS)}")
        self._module = module

    def __getattr__(self, name: str) -> EngineFunction:
        if name.startswith("__"):
            raise AttributeError(name)
        return EngineFunction(self._module, name)


def engine_module(module: str) -> Any:
    """A stand-in for ``jaxsys_kernel.engine.<module>`` whose functions are sent, not run.

    Examples
    --------
    >>> cache = engine_module("cache")
    >>> cache.list_entries
    <engine function jaxsys_kernel.engine.cache.list_entries>
    """
    return _EngineModule(module)
