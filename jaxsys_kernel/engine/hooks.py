"""Per-cell work on an engine: one registry of hooks run before, after and on error.

The kernel asks for hooks by name in the code it sends: the cell's first line becomes a
marker comment (``#jaxsys-cell-hooks {"thread_guard": {}, ...}``), see :func:`wrap`. On the
engine, :func:`install` registers three things with IPython once per process:

- a ``pre_run_cell`` handler that reads the marker from the raw cell and calls each named
  hook's ``before(options)``;
- an input transformer that removes the marker line before the cell is compiled, so the
  user's line numbers (tracebacks, hang reports, divergence messages) stay their own;
- a ``post_run_cell`` handler that calls ``after(state)``, or ``error(state, exc)`` when
  the cell raised, for every hook whose ``before`` ran, in reverse order.

So per-cell work costs no request beyond the cell's own ``execute_request``. A hook that
fails is reported on the cell's stderr and never stops the cell or the other hooks.

Registered hooks: ``thread_guard`` (:mod:`.guards`), ``divergence`` (:mod:`.divergence`) and
``profile`` (:mod:`.profiling`); each module registers its own entry on import.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from IPython import get_ipython

from ..errors import EngineError
from .state import STATE

MARKER = "#jaxsys-cell-hooks "
# The mime type of what hooks send to the kernel while their cell runs (``display_data``
# on the cell's own channel); the kernel takes these off before anything is shown.
RECORD_MIME = "application/vnd.jaxsys.hook-record+json"
# The name of the annotation that marks the start of a profiled cell in each trace.
PROFILE_MARK = "jaxsys: cell starts"


@dataclass(frozen=True)
class Hook:
    """One entry of the registry.

    Attributes
    ----------
    name : str
        The name the kernel asks for.
    before : callable
        ``before(options) -> state``, called as the cell starts.
    after : callable, optional
        ``after(state)``, called when the cell finished without an error.
    error : callable, optional
        ``error(state, exc)``, called when the cell raised ``exc``; ``after`` when omitted.
    """

    name: str
    before: Callable[[dict], Any]
    after: Callable[[Any], None] | None = None
    error: Callable[[Any, BaseException], None] | None = None


_registry: dict[str, Hook] = {}
# Where each built-in entry is registered; imported on first use (those modules import this
# one, so importing them here would make a cycle).
BUILTIN = {
    "thread_guard": "jaxsys_kernel.engine.guards",
    "divergence": "jaxsys_kernel.engine.divergence",
    "profile": "jaxsys_kernel.engine.profiling",
}


def register(hook: Hook) -> Hook:
    """Add ``hook`` to the registry (a later entry of the same name replaces it)."""
    _registry[hook.name] = hook
    return hook


def registered() -> list[str]:
    """The names of every registered hook (after loading the modules that register them)."""
    _load_builtin()
    return sorted(_registry)


def wrap(code: str, hooks: dict[str, dict] | None) -> str:
    """The code to send for a cell that runs the named hooks (``{name: options}``).

    Pure and cheap: the kernel calls it for every cell. Without hooks the code is unchanged.
    """
    if not hooks:
        return code
    return MARKER + json.dumps(hooks, separators=(",", ":"), sort_keys=True) + "\n" + code


def parse(raw_cell: str) -> tuple[dict[str, dict], str]:
    """Split a cell sent by :func:`wrap` into its hooks and the user's code.

    Raises
    ------
    EngineError
        The marker line is not valid JSON naming hooks with option dicts.
    """
    if not raw_cell.startswith(MARKER):
        return {}, raw_cell
    first, _, rest = raw_cell.partition("\n")
    # Copies: a hook may change the options it is given, never the cached ones.
    return {name: dict(options) for name, options in _read_marker(first).items()}, rest


@functools.lru_cache(maxsize=32)
def _read_marker(first: str) -> dict[str, dict]:
    # Cached: the kernel sends the same few marker lines cell after cell.
    try:
        hooks = json.loads(first[len(MARKER) :])
    except ValueError as e:
        raise EngineError(f"the cell's hook line is not JSON ({e}): {first!r}") from None
    if not isinstance(hooks, dict) or not all(isinstance(v, dict) for v in hooks.values()):
        raise EngineError(f"the cell's hook line must map names to option dicts: {first!r}")
    return hooks


def arm_next(hooks: dict[str, dict]) -> bool:
    """Run ``hooks`` around the next cell too (for callers that cannot wrap its code)."""
    if not install():
        return False
    STATE.hooks.pending.update(hooks)
    return True


def _strip_marker(lines: list[str]) -> list[str]:
    if lines and lines[0].startswith(MARKER):
        return lines[1:]
    return lines


def _warn(what: str, name: str, exc: BaseException) -> None:
    print(f"jaxsys: the {name} hook failed {what} the cell: {exc!r}", file=sys.stderr)


def begin(hooks: dict[str, dict]) -> list[str]:
    """Run ``before`` of each named hook; returns the names that ran."""
    _load_builtin()
    ran = []
    for name, options in hooks.items():
        hook = _registry.get(name)
        if hook is None:
            print(f"jaxsys: no cell hook named {name!r} on this process", file=sys.stderr)
            continue
        try:
            state = hook.before(options)
        except Exception as e:  # noqa: BLE001 - a failing hook must never stop the cell
            _warn("before", name, e)
            continue
        STATE.hooks.active.append((hook, state))
        ran.append(name)
    return ran


def end(exc: BaseException | None = None) -> None:
    """Run ``after`` (or ``error`` when ``exc``) of every hook that began, last first."""
    while STATE.hooks.active:
        hook, state = STATE.hooks.active.pop()
        try:
            if exc is not None and hook.error is not None:
                hook.error(state, exc)
            elif hook.after is not None:
                hook.after(state)
        except Exception as e:  # noqa: BLE001 - one failing hook must not skip the others
            _warn("after", hook.name, e)


def _pre_run_cell(info) -> None:
    end()  # a cell that never reached post_run_cell must not leave its hooks armed
    try:
        hooks, _ = parse(getattr(info, "raw_cell", "") or "")
    except EngineError as e:
        print(f"jaxsys: {e}", file=sys.stderr)
        hooks = {}
    if STATE.hooks.pending:
        hooks = {**STATE.hooks.pending, **hooks}
        STATE.hooks.pending.clear()
    if hooks:
        begin(hooks)


def _post_run_cell(result) -> None:
    exc = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
    end(exc)


def _load_builtin() -> None:
    for name, module in BUILTIN.items():
        if name not in _registry:
            importlib.import_module(module)


def install() -> bool:
    """Follow this engine's cells; calling it again does nothing.

    Returns
    -------
    bool
        False outside an IPython shell.
    """
    if STATE.hooks.installed:
        return True
    shell = get_ipython()
    if shell is None:
        return False
    _load_builtin()
    # First of the cleanup transformers: the marker must go before anything reads the cell.
    shell.input_transformers_cleanup.insert(0, _strip_marker)
    shell.events.register("pre_run_cell", _pre_run_cell)
    shell.events.register("post_run_cell", _post_run_cell)
    STATE.hooks.installed = True
    return True


def installed() -> bool:
    """Whether :func:`install` ran in this process."""
    return STATE.hooks.installed


__all__ = [
    "MARKER",
    "RECORD_MIME",
    "Hook",
    "arm_next",
    "begin",
    "end",
    "install",
    "parse",
    "register",
    "registered",
    "wrap",
]
